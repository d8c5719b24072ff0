"""Vision-language models on the DTensor backend, one in-process worker, for each tiny family (Qwen2.5-VL,
Qwen3-VL, Idefics3): image rows in the batch, logprobs exact under any micro-batching, freeze_vision, LoRA on
the language model only, DCP round trip, HF export with the processor files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from backend_testlib import MaskedNLL
from vlm_testlib import FAMILIES, chats, image_module_prefixes, vlm_batch

from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.batch import select
from rl_core.models.processor import load_processor

SMOOTH_ADAM = {"lr": 1e-3, "eps": 1e-3}  # see test_dtensor_local.py


def local_cfg(**overrides) -> TrainBackendConfig:
    return TrainBackendConfig(**({"use_ray": False, "optimizer": SMOOTH_ADAM, "reference_model": False} | overrides))


@pytest.fixture(scope="module", params=FAMILIES)
def vlm(request, tmp_path_factory):
    """``(family, model dir, processor, batch of 3 chats)``; the dir carries an extra named chat template."""
    from rl_core.models.tiny_vlm import save_tiny_vlm

    path = save_tiny_vlm(tmp_path_factory.mktemp(request.param), family=request.param)
    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "plain.jinja").write_text("{{ messages[0]['content'] }}")
    processor = load_processor(path)
    return request.param, str(path), processor, vlm_batch(processor, chats())


def hf_logprobs(model, batch) -> torch.Tensor:
    """[B, T] logprobs of a plain HF forward over ``batch`` (column t scores token t; 0 elsewhere)."""
    from rl_core.vision_batch import forward_image_inputs

    extra = forward_image_inputs(batch) | ({"mm_token_type_ids": batch["mm_token_type_ids"]}
                                           if "mm_token_type_ids" in batch else {})
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **extra).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(lp.shape[0], 1), lp * batch["attention_mask"][:, 1:]], dim=1)


def test_padded_batch_gives_each_sample_its_logprobs_alone(vlm):
    family, path, _, batch = vlm
    with build_training_backend(local_cfg(micro_batch_size=2, reference_model=True), path) as policy:
        together = policy.logprobs(batch)
        alone = [policy.logprobs(select(batch, [i])) for i in range(3)]
        values, indices = policy.topk_logits(batch, 3)
        alone_topk = [policy.topk_logits(select(batch, [i]), 3) for i in range(3)]
        reference = policy.reference_logprobs(batch)
        metrics = policy.train(batch, MaskedNLL())
        after = policy.logprobs(batch)
        reference_after = policy.reference_logprobs(batch)
    lengths = batch["attention_mask"].sum(1).tolist()
    for i, row in enumerate(alone):
        assert (together[i] - row[0]).abs().max() <= 1e-5, (family, i)
        assert (together[i, lengths[i]:] == 0).all()
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    torch.testing.assert_close(together, hf_logprobs(model, batch), rtol=0, atol=1e-5)
    for i, (alone_values, alone_indices) in enumerate(alone_topk):
        n = lengths[i]
        torch.testing.assert_close(values[i, 1:n], alone_values[0, 1:n], rtol=0, atol=1e-5)
        assert torch.equal(indices[i, 1:n], alone_indices[0, 1:n])
    torch.testing.assert_close(reference, together, rtol=0, atol=0)
    assert metrics["num_valid_tokens"] == 18 and metrics["grad_norm"] > 0
    assert (after - together).abs().max() > 1e-4  # the step changed the policy ...
    torch.testing.assert_close(reference_after, together, rtol=0, atol=0)  # ... not the reference


def test_images_reach_the_loss(vlm):
    """Another image with the same tokens gives other logprobs (the pixels are in the forward)."""
    family, path, processor, batch = vlm
    other = dict(batch)
    other["pixel_values"] = batch["pixel_values"].flip(0) if family == "idefics3" else batch["pixel_values"] * -1
    with build_training_backend(local_cfg(), path) as policy:
        assert (policy.logprobs(batch) - policy.logprobs(other))[:2].abs().max() > 1e-4


def test_freeze_vision_leaves_vision_weights_bit_identical(vlm, tmp_path):
    family, path, _, batch = vlm
    with build_training_backend(local_cfg(freeze_vision=True), path) as policy:
        before = {k: v.clone() for k, v in policy.named_weights()}  # named_weights may alias the parameters
        policy.train(batch, MaskedNLL())
        after = dict(policy.named_weights())
        policy.save(str(tmp_path / "ckpt"))
    vision = image_module_prefixes(family)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and not any(name.startswith(vision) for name in changed)
    assert any(name.startswith("model.language_model." if family != "idefics3" else "model.text_model.")
               for name in changed)
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(tmp_path / "ckpt" / "dcp")).read_metadata().state_dict_metadata
    optimizer_keys = [k for k in keys if k.startswith("optimizer.state.")]
    assert optimizer_keys and not any(f".{prefix}" in key for key in optimizer_keys for prefix in vision)


def test_lora_trains_adapters_on_the_language_model_only(vlm, tmp_path):
    family, path, _, batch = vlm
    lora = {"rank": 4, "alpha": 8.0}
    with build_training_backend(local_cfg(lora=lora, optimizer={"lr": 1e-2}), path) as policy:
        before = {k: v.clone() for k, v in policy.named_weights()}  # named_weights may alias the parameters
        for _ in range(2):  # B starts at zero: the second step moves the merged weights
            policy.train(batch, MaskedNLL())
        after = dict(policy.named_weights())
        policy.save_adapter(str(tmp_path / "adapter"))
    language = "model.text_model." if family == "idefics3" else "model.language_model."
    adapted = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
               "up_proj.weight", "down_proj.weight")
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == {name for name in before if name.startswith(language) and name.endswith(adapted)}
    from safetensors.torch import load_file

    adapter = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert adapter and all(name.startswith(f"base_model.model.{language}") for name in adapter)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    import re

    assert re.fullmatch(config["target_modules"], f"{language}layers.0.self_attn.q_proj")
    vision_q = "model.vision_model.encoder.layers.0.self_attn.q_proj" if family == "idefics3" else "model.visual.blocks.0.attn.qkv"
    assert not re.fullmatch(config["target_modules"], vision_q)


def test_dcp_round_trip_and_hf_export_with_processor_files(vlm, tmp_path):
    family, path, processor, batch = vlm
    next_batches = [select(batch, [2, 0, 1]), select(batch, [1, 2, 0])]
    with build_training_backend(local_cfg(micro_batch_size=2), path) as policy:
        policy.train(batch, MaskedNLL())
        policy.save(str(tmp_path / "ckpt"))
        expected = [policy.train(b, MaskedNLL()) for b in next_batches]
        weights = dict(policy.named_weights())
        logprobs = policy.logprobs(batch)
        policy.export_hf(str(tmp_path / "hf"))
    with build_training_backend(local_cfg(micro_batch_size=2), path) as fresh:
        assert fresh.load(str(tmp_path / "ckpt")) == 1
        assert [fresh.train(b, MaskedNLL()) for b in next_batches] == expected
        resumed = dict(fresh.named_weights())
    assert resumed.keys() == weights.keys() and all(torch.equal(resumed[k], weights[k]) for k in weights)
    assert (tmp_path / "ckpt" / "hf_config" / "additional_chat_templates" / "plain.jinja").is_file()

    from transformers import AutoModelForImageTextToText

    export = tmp_path / "hf"
    model = AutoModelForImageTextToText.from_pretrained(export, dtype=torch.float32).eval()
    assert type(model).__name__ == {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                                    "qwen3_vl": "Qwen3VLForConditionalGeneration",
                                    "idefics3": "Idefics3ForConditionalGeneration"}[family]
    torch.testing.assert_close(hf_logprobs(model, batch), logprobs, rtol=0, atol=1e-5)
    for name in ("processor_config.json", "chat_template.jinja", "tokenizer.json", "tokenizer_config.json",
                 "additional_chat_templates/plain.jinja"):
        assert (export / name).is_file(), name
    reloaded = vlm_batch(load_processor(export), chats())
    assert all(torch.equal(reloaded[k], batch[k]) for k in batch)
    shutil.rmtree(tmp_path / "ckpt")


def test_text_only_micro_batch_still_runs_the_sharded_vision_tower(vlm):
    """With FSDP2 (bf16 shards it even on one rank), a forward without images runs the image-only modules on a
    dummy image: each image parameter gets a gradient (zero), so every rank runs the same collectives."""
    family, path, _, batch = vlm
    text_only = select(batch, [2])
    text_only = {k: v for k, v in text_only.items() if k not in ("pixel_values", "image_grid_thw",
                                                                 "pixel_attention_mask")}
    with build_training_backend(local_cfg(dtype="bfloat16"), path) as policy:
        plain = policy.logprobs(text_only)
        padded_rows = policy.logprobs(select(batch, [2]))  # the row keeps its (empty) image rows
        policy.train(text_only, MaskedNLL())
        model = policy.group._local.worker.model
        grads = {name: p.grad for name, p in model.named_parameters() if name.startswith(image_module_prefixes(family))}
    assert grads and all(g is not None and float(g.full_tensor().abs().max()) == 0.0 for g in grads.values())
    torch.testing.assert_close(padded_rows, plain, rtol=0, atol=0)


def test_what_the_backends_cannot_do_with_a_vlm_is_refused_up_front(vlm, tiny_model_dir):
    from rl_backends_train.vision import check_vision_support

    family, path, _, _ = vlm
    refusals = {"megatron": ({"backend": "megatron"}, "set backend=dtensor"),
                "packing": ({"packing": {"enabled": True}}, "set packing.enabled=false"),
                "tensor parallel": ({"num_workers": 2, "tensor_parallel_size": 2}, "set tensor_parallel_size=1"),
                "reward model": ({"task": "reward_model"}, "only task=causal_lm")}
    for overrides, fix in refusals.values():
        with pytest.raises(ValueError, match=fix):
            check_vision_support(TrainBackendConfig(**overrides), path)
    with pytest.raises(ValueError, match="is a text-only model"):
        build_training_backend(local_cfg(freeze_vision=True), tiny_model_dir)


def test_dynamic_batching_and_activation_checkpointing_give_the_same_step(vlm):
    """Rows sorted by length carry their images with them; recomputed vision and language blocks give the
    same gradients."""
    _, path, _, batch = vlm
    results = []
    for overrides in ({"micro_batch_size": 1},
                      {"dynamic_batching": {"enabled": True, "max_tokens_per_micro_batch": 80},
                       "activation_checkpointing": True}):
        with build_training_backend(local_cfg(**overrides), path) as policy:
            metrics = policy.train(batch, MaskedNLL())
            results.append((metrics, dict(policy.named_weights()), policy.logprobs(batch)))
    (plain, plain_weights, plain_after), (other, other_weights, other_after) = results
    assert other["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert other["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    for name, tensor in plain_weights.items():
        torch.testing.assert_close(other_weights[name], tensor, rtol=0, atol=1e-6, msg=name)
    torch.testing.assert_close(other_after, plain_after, rtol=0, atol=1e-5)
