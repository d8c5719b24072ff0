"""Model families on the Megatron-core backend (CPU, gloo): Qwen3 (q/k norms: megatron-core's
``qk_layernorm``) and Qwen3-MoE (Qwen3 attention, experts without a shared one, HF routing with and
without ``norm_topk_prob``) equal the DTensor backend (transformers' own modules); Qwen3 with tensor
parallel 2 equals one rank (the q/k norm gradients summed over TP); families megatron-core cannot build
are refused in the driver with the family, the layer type and the DTensor backend named."""

from __future__ import annotations

import re

import pytest
import torch
from backend_testlib import (
    assert_megatron_steps_like_dtensor,
    assert_same_run,
    make_batch,
    megatron_config,
    two_steps,
)

from rl_backends_train import TrainBackendConfig, build_training_backend

pytest.importorskip("megatron.core")

VOCAB = 500
BASE = {"optimizer": {"lr": 1e-3, "eps": 1e-3}, "reference_model": False}
# The settings of rl_core.models.tiny's qwen3 / qwen3_moe (helper "families" adds them there; until
# then this file builds the same configs itself).
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
               head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
               bos_token_id=None)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)


def save_tiny(path, family: str, **overrides) -> str:
    """A tiny random ``family`` model (seeded, fp32) with the tiny tokenizer, saved as an HF directory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl_core.models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = AutoConfig.for_model(family, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, **(_COMMON | overrides))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def megatron(**overrides) -> TrainBackendConfig:
    return megatron_config(BASE, **overrides)


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("megatron-families")
    return {"qwen3": save_tiny(root / "qwen3", "qwen3"),
            "qwen3_moe": save_tiny(root / "qwen3_moe", "qwen3_moe", **_MOE),
            # Not renormalised over the top k: megatron-core's softmax before top-k.
            "qwen3_moe_unnormalised": save_tiny(root / "qwen3_moe_u", "qwen3_moe", **(_MOE | {"norm_topk_prob": False}))}


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "qwen3_moe_unnormalised"])
def test_steps_equal_the_dtensor_backend(qwen3_dirs, family, skewed_lengths):
    """HF files -> GPTModel -> named_weights bit-exact (experts stacked as HF holds them); logprobs, a
    step and the weights after it equal the DTensor backend's; the q/k norms trained."""
    initial, after = assert_megatron_steps_like_dtensor(qwen3_dirs[family], make_batch(VOCAB, skewed_lengths), BASE)
    for name in ("model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"):
        assert not torch.equal(after[name], initial[name]), name


def test_qwen3_tensor_parallel_2_equals_one_rank(ray_session, tmp_path, skewed_lengths):
    """Two tensor-parallel ranks, one KV head each: each normalises its own heads' queries and keys with
    the replicated q/k norms, whose gradients are summed over the TP group: the same run as one rank."""
    model_dir = save_tiny(tmp_path / "qwen3-kv2", "qwen3", num_key_value_heads=2)
    batches = make_batch(VOCAB, skewed_lengths), make_batch(VOCAB, skewed_lengths[::-1], seed=1)
    with build_training_backend(megatron(num_workers=2, tensor_parallel_size=2), model_dir) as policy:
        tp2 = two_steps(policy, batches)
    with build_training_backend(megatron(), model_dir) as policy:
        tp1 = two_steps(policy, batches)
    assert_same_run(tp2, tp1)


# model_type -> (what AutoConfig.for_model needs beyond its defaults, the layer type the refusal names)
_REFUSED = {
    "qwen3_5_text": ({}, "gated delta-net linear-attention layers"),
    "qwen3_5_moe_text": ({}, "gated delta-net linear-attention layers"),
    "nemotron_h": ({}, "Mamba-2 state-space layers"),
    "glm4_moe_lite": ({}, "multi-head latent attention (MLA) layers and MoE with shared experts"),
    "gemma3_text": ({}, "sliding-window attention layers"),
    "gpt_oss": ({}, "sliding-window attention layers with attention sinks"),
}


@pytest.mark.parametrize("family", sorted(_REFUSED))
def test_families_megatron_core_cannot_build_are_refused(tmp_path, family):
    """In the driver, before any worker starts: one ValueError naming the family, its layer type and the
    DTensor backend."""
    from transformers import AutoConfig

    extra, layers = _REFUSED[family]
    AutoConfig.for_model(family, **extra).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"^{family}: its {re.escape(layers)}.*use the DTensor backend \(policy.backend=dtensor\)"):
        build_training_backend(megatron(), str(tmp_path))


def test_qwen3_moe_with_dense_layers_is_refused(tmp_path):
    from transformers import AutoConfig

    AutoConfig.for_model("qwen3_moe", mlp_only_layers=[0]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"qwen3_moe with dense MLP layers \(mlp_only_layers=\[0\].*policy.backend=dtensor"):
        build_training_backend(megatron(), str(tmp_path))


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_megatron_generation_of_the_family_equals_hf_greedy(qwen3_dirs, family):
    """generation.backend=megatron on the family's GPTModel: HF generate's greedy tokens, logprobs of the
    training forward (1e-5)."""
    from transformers import AutoModelForCausalLM

    from rl_backends_gen import GenerationConfig, build_generation_backend
    from rl_core.types import SamplingParams

    prompts = [[5, 17, 42, 99, 7], [8, 300, 12]]
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dirs[family], dtype=torch.float32).eval()
    with build_training_backend(megatron(), qwen3_dirs[family]) as policy:
        generation = build_generation_backend(GenerationConfig(backend="megatron"), qwen3_dirs[family], policy=policy)
        results = generation.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(2,)))
        for prompt, (completion,) in zip(prompts, results):
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=2,
                                   pad_token_id=3)[0, len(prompt):].tolist()
            assert completion.token_ids == expected
            ids = torch.tensor([prompt + completion.token_ids])
            trained = policy.logprobs({"input_ids": ids, "attention_mask": torch.ones_like(ids)})[0, len(prompt):]
            torch.testing.assert_close(trained, torch.tensor(completion.logprobs), rtol=0, atol=1e-5)
