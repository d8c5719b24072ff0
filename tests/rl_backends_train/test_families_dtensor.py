"""The DTensor backend on every model family (tiny random models of ``rl_core.models.tiny.FAMILIES``):
logprobs equal to transformers' forward, a training step equal across micro-batch layouts, packing
(with sliding-window masks) or its refusal, FSDP2 on 2 ranks, tensor parallel from HF's own plan or its
refusal, and LoRA on each family's own Linear names. ``SUPPORT`` is the matrix docs/models.md shows."""

from __future__ import annotations

import json

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch, make_grouped_batch
from test_dtensor_ray import VOCAB, assert_same_step, cfg, one_step

from rl_backends_train import build_training_backend
from rl_backends_train.families import LORA_TARGETS, STANDARD_LORA_TARGETS, tensor_parallel_layer_plan
from rl_core.cluster import WorkerError
from rl_core.models.tiny import FAMILIES

RECURRENT = {"qwen3_5_text", "qwen3_5_moe_text", "nemotron_h"}  # packing refused
TENSOR_PARALLEL = {"llama", "qwen2", "qwen3", "qwen3_5_text", "gemma3_text"}  # HF plan translated


@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_equal_hf_forward_and_micro_batching_is_exact(family, tiny_family_dir, skewed_lengths):
    from transformers import AutoModelForCausalLM

    path = tiny_family_dir(family)
    batch = make_batch(VOCAB, skewed_lengths)  # lengths 5..40: beyond the sliding windows (8)
    padded = one_step(path, batch, use_ray=False, micro_batch_size=4)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    real = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(padded[0][:, 1:][real], expected[real], rtol=0, atol=1e-5)
    assert padded[1]["loss"] > 0 and padded[3][:, 1:][real].sub(padded[0][:, 1:][real]).abs().max() > 1e-4
    assert_same_step(padded, one_step(path, batch, use_ray=False, micro_batch_size=1))


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - RECURRENT))
def test_shared_prompt_packing_equals_padded(family, tiny_family_dir):
    """Prompts packed once per group, answers after them, sequences longer than the sliding windows:
    the padded step (sliding-window layers get a windowed packed mask)."""
    path = tiny_family_dir(family)
    batch = make_grouped_batch(VOCAB, [11, 6, 17], [[5, 9, 1, 7], [12, 3, 8, 2], [4, 6, 10, 5]], seed=5)
    packing = {"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": 64}
    assert_same_step(one_step(path, batch, use_ray=False), one_step(path, batch, use_ray=False, packing=packing))


@pytest.mark.parametrize("family", sorted(RECURRENT))
def test_packing_is_refused_for_recurrent_layers(family, tiny_family_dir):
    with pytest.raises(WorkerError, match=rf"packing.enabled=true is not supported for {family}: its "
                                          r"\['linear_attention'\] layers"):
        build_training_backend(cfg(use_ray=False, packing={"enabled": True}), tiny_family_dir(family))


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"llama"}))  # llama: test_dtensor_ray.py
def test_two_fsdp_ranks_equal_one(family, ray_session, tiny_family_dir, skewed_lengths):
    path = tiny_family_dir(family)
    batch = make_batch(VOCAB, skewed_lengths)
    assert_same_step(one_step(path, batch, use_ray=False), one_step(path, batch, num_workers=2))


@pytest.fixture(scope="module")
def tp_dirs(tmp_path_factory):
    """Tiny models with 2 key/value heads, so tensor parallel 2 can split them."""
    from rl_core.models import save_tiny_model

    return {family: str(save_tiny_model(tmp_path_factory.mktemp(f"tp-{family}"), family=family,
                                        num_key_value_heads=2))
            for family in sorted(TENSOR_PARALLEL - {"llama"})}


@pytest.mark.parametrize("family", sorted(TENSOR_PARALLEL - {"llama"}))  # llama: test_dtensor_ray.py
def test_tensor_parallel_2_from_the_hf_plan_equals_1(family, ray_session, tp_dirs, skewed_lengths):
    """q/k norms (Qwen3, Gemma 3) have their gradients summed over the ranks; Qwen3.5's linear
    attention projections gather their outputs."""
    batch = make_batch(VOCAB, skewed_lengths[:4])
    path = tp_dirs[family]
    assert_same_step(one_step(path, batch, use_ray=False), one_step(path, batch, num_workers=2, tensor_parallel_size=2),
                     atol=1e-5)


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - TENSOR_PARALLEL))
def test_tensor_parallel_is_refused_without_a_translatable_plan(family, tiny_tokenizer):
    from rl_checkpoint.megatron_mapping import MAPPED_FAMILIES
    from rl_core.models import tiny_model_config

    with pytest.raises(ValueError, match=rf"tensor parallel: {family}.*set tensor_parallel_size=1") as error:
        tensor_parallel_layer_plan(tiny_model_config(tiny_tokenizer, family))
    # the Megatron backend is suggested only for the families it builds
    assert ("backend=megatron" in str(error.value)) == (family in MAPPED_FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_trains_the_family_default_targets(family, tiny_family_dir, skewed_lengths, tmp_path):
    path = tiny_family_dir(family)
    batch = make_batch(VOCAB, skewed_lengths[:4])
    with build_training_backend(cfg(use_ray=False, lora={"rank": 4}, optimizer={"lr": 1e-2}), path) as policy:
        initial = dict(policy.named_weights())
        policy.train(batch, MaskedNLL())
        changed = {name for name, w in policy.named_weights() if not torch.equal(w, initial[name])}
        policy.save_adapter(str(tmp_path))
    targets = sorted(LORA_TARGETS.get(family, STANDARD_LORA_TARGETS))
    assert json.loads((tmp_path / "adapter_config.json").read_text())["target_modules"] == targets
    assert changed and {name.rsplit(".", 2)[-2] for name in changed} == set(targets)


def test_lora_target_that_matches_nothing_lists_the_family_linears(tiny_family_dir):
    lora = {"rank": 4, "target_modules": ["q_proj", "gate_proj"]}
    with pytest.raises(WorkerError, match=r"\['gate_proj'\] match no nn.Linear of gpt_oss; its Linear names are "
                                         r"\['k_proj', 'o_proj', 'q_proj', 'v_proj'\]"):
        build_training_backend(cfg(use_ray=False, lora=lora), tiny_family_dir("gpt_oss"))


def test_the_documented_matrix_is_the_tested_one(documented_families):
    assert set(documented_families) == set(FAMILIES)
    for family, row in documented_families.items():
        assert row["DTensor (FSDP2)"] == "yes", family
        assert row["tensor parallel"] == ("yes" if family in TENSOR_PARALLEL else "no"), family
        assert row["packing"] == ("no" if family in RECURRENT else "yes"), family
        assert row["LoRA default targets"].split() == list(LORA_TARGETS.get(family, STANDARD_LORA_TARGETS)), family
