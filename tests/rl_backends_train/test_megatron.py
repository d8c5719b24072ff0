"""The Megatron-core backend on CPU (megatron-core 0.16.1, TP = PP = 1) against the DTensor backend."""

from __future__ import annotations

import sys

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch
from safetensors.torch import load_file

from rl_backends_train import TrainBackendConfig, build_training_backend

VOCAB = 500
BASE = {"use_ray": False, "optimizer": {"lr": 1e-3, "eps": 1e-3}, "reference_model": False}


def test_missing_megatron_names_the_extra(monkeypatch):
    from rl_backends_train.megatron import require_megatron

    monkeypatch.setitem(sys.modules, "megatron.core", None)  # what an absent package looks like to import
    with pytest.raises(ImportError, match=r'pip install|rl-backends-train\[megatron\]'):
        require_megatron()


def test_unsupported_megatron_options_fail_before_start(tiny_model_dir):
    pytest.importorskip("megatron.core")
    cfg = TrainBackendConfig(backend="megatron", use_ray=False, lora={"rank": 2})
    with pytest.raises(ValueError, match="does not support: lora"):
        build_training_backend(cfg, tiny_model_dir)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hf_to_megatron_to_hf_is_exact(family, tiny_model_dir, tiny_qwen2_dir):
    """HF safetensors -> GPTModel parameters (fused qkv / fc1) -> named_weights in HF names."""
    pytest.importorskip("megatron.core")
    model_dir = tiny_model_dir if family == "llama" else tiny_qwen2_dir
    hf = load_file(f"{model_dir}/model.safetensors")
    with build_training_backend(TrainBackendConfig(backend="megatron", **BASE), model_dir) as megatron:
        back = dict(megatron.named_weights())
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_megatron_matches_dtensor(family, tiny_model_dir, tiny_qwen2_dir, skewed_lengths):
    pytest.importorskip("megatron.core")
    model_dir = tiny_model_dir if family == "llama" else tiny_qwen2_dir
    batch = make_batch(VOCAB, skewed_lengths)
    with build_training_backend(TrainBackendConfig(**BASE), model_dir) as dtensor, \
            build_training_backend(TrainBackendConfig(backend="megatron", **BASE), model_dir) as megatron:
        torch.testing.assert_close(megatron.logprobs(batch), dtensor.logprobs(batch), rtol=0, atol=1e-5)
        a, b = dtensor.train(batch, MaskedNLL()), megatron.train(batch, MaskedNLL())
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        weights_a, weights_b = dict(dtensor.named_weights()), dict(megatron.named_weights())
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        torch.testing.assert_close(weights_b[name], weights_a[name], rtol=0, atol=1e-6, msg=name)


def test_megatron_packing_checkpoint_and_export(tiny_model_dir, skewed_lengths, tmp_path):
    pytest.importorskip("megatron.core")
    from transformers import AutoModelForCausalLM

    batches = [make_batch(VOCAB, skewed_lengths, seed=s) for s in range(2)]
    packed = {"packing": {"enabled": True, "max_tokens_per_micro_batch": 48}}
    cfg = TrainBackendConfig(backend="megatron", **BASE, **packed)
    with build_training_backend(TrainBackendConfig(backend="megatron", **BASE), tiny_model_dir) as padded, \
            build_training_backend(cfg, tiny_model_dir) as policy:
        torch.testing.assert_close(policy.logprobs(batches[0]), padded.logprobs(batches[0]), rtol=0, atol=1e-5)
        policy.train(batches[0], MaskedNLL())
        policy.save(str(tmp_path / "ckpt"))
        expected = policy.train(batches[1], MaskedNLL())
        policy.export_hf(str(tmp_path / "hf"))
        after = policy.logprobs(batches[1])
    with build_training_backend(cfg, tiny_model_dir) as fresh:
        assert fresh.load(str(tmp_path / "ckpt")) == 1
        assert fresh.train(batches[1], MaskedNLL()) == expected  # bitwise resume
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    batch = batches[1]
    with torch.no_grad():
        logits = exported(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(lp[mask], after[:, 1:][mask], rtol=0, atol=1e-5)


def test_two_megatron_workers_equal_one(ray_session, tiny_model_dir, skewed_lengths):
    """Data parallel Megatron: replicated parameters, gradients summed over the ranks."""
    pytest.importorskip("megatron.core")
    batch = make_batch(VOCAB, skewed_lengths)
    results = []
    two_ranks = TrainBackendConfig(backend="megatron", **(BASE | {"use_ray": True, "num_workers": 2}))
    for cfg in (two_ranks, TrainBackendConfig(backend="megatron", **BASE)):
        with build_training_backend(cfg, tiny_model_dir) as policy:
            results.append((policy.train(batch, MaskedNLL()), dict(policy.named_weights())))
    (two, weights_two), (one, weights_one) = results
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    for name in weights_one:
        torch.testing.assert_close(weights_two[name], weights_one[name], rtol=0, atol=1e-6, msg=name)
