"""LoRA on the Megatron-core backend (CPU, megatron-core 0.16.1) against the DTensor backend's LoRA:
one adapter pair per HF projection on Megatron's fused qkv / fc1, PEFT names, merged refit/export
weights, the base as reference, exact resume, tensor parallel 2 (gloo) equal to 1."""

from __future__ import annotations

import json

import pytest
import torch
from backend_testlib import MaskedNLL, assert_export_scores_like, make_batch
from safetensors.torch import load_file

from rl_backends_train import LoRAConfig, TrainBackendConfig, build_training_backend
from rl_backends_train.lora import adapter_config, write_adapter

pytest.importorskip("megatron.core")

VOCAB = 500
# k_proj and gate_proj left out: their rows of the fused linear_qkv / linear_fc1 get no update.
LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}
SCALE = 2.0
BASE = {"use_ray": False, "optimizer": {"lr": 1e-2, "eps": 1e-3}, "lora": LORA}
TARGETED = tuple(f"{p}.weight" for p in LORA["target_modules"])


@pytest.fixture(scope="module")
def gqa_model_dir(tmp_path_factory):
    """A tiny Llama with 4 query heads in 2 KV groups: linear_qkv interleaves [q q k v] twice, and
    tensor parallel 2 gives each rank one group."""
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-llama-gqa"), family="llama",
                               num_attention_heads=4, num_key_value_heads=2))


def random_adapter(path, model_dir: str, seed: int = 0) -> None:
    """A PEFT adapter with non-zero A and B for every targeted projection of ``model_dir``."""
    gen = torch.Generator().manual_seed(seed)
    adapters = {}
    for name, weight in load_file(f"{model_dir}/model.safetensors").items():
        if name.endswith(TARGETED):
            module = name.removesuffix(".weight")
            adapters[f"{module}.lora_A.weight"] = torch.randn(LORA["rank"], weight.shape[1], generator=gen) * 0.1
            adapters[f"{module}.lora_B.weight"] = torch.randn(weight.shape[0], LORA["rank"], generator=gen) * 0.1
    write_adapter(path, adapters, adapter_config(LoRAConfig(**LORA), model_dir, "causal_lm"))


def read_adapter(path) -> tuple[dict[str, torch.Tensor], dict]:
    return load_file(f"{path}/adapter_model.safetensors"), json.loads((path / "adapter_config.json").read_text())


def assert_same_tensors(actual: dict, expected: dict, atol: float) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_megatron_lora_matches_dtensor(family, gqa_model_dir, tiny_qwen2_dir, skewed_lengths, tmp_path):
    """Same adapters -> same steps, logits and PEFT files; the reference is the untouched base."""
    model_dir = gqa_model_dir if family == "llama" else tiny_qwen2_dir  # qwen2: fused q/k/v biases too
    batch = make_batch(VOCAB, skewed_lengths)
    with build_training_backend(TrainBackendConfig(**BASE), model_dir) as dtensor, \
            build_training_backend(TrainBackendConfig(backend="megatron", **BASE), model_dir) as megatron:
        base = megatron.logprobs(batch)
        dtensor.save_adapter(tmp_path / "start")
        megatron.load_adapter(tmp_path / "start")  # the DTensor backend's initial A (B = 0)
        # (b) the first step moves B only (A's gradient is 0 while B = 0), the second A too
        steps = [(dtensor.train(batch, MaskedNLL()), megatron.train(batch, MaskedNLL())) for _ in range(2)]
        stepped_dtensor, stepped_megatron = dtensor.logprobs(batch), megatron.logprobs(batch)
        dtensor.save_adapter(tmp_path / "dtensor")
        megatron.save_adapter(tmp_path / "megatron")
        # (a) exactly the same non-zero adapters in both backends
        megatron.load_adapter(tmp_path / "dtensor")
        logits_dtensor, logits_megatron = dtensor.topk_logits(batch, 8), megatron.topk_logits(batch, 8)
        same_dtensor, same_megatron = dtensor.logprobs(batch), megatron.logprobs(batch)
        megatron.save_adapter(tmp_path / "megatron_copy")
        # (f) adapters off: the base model
        reference, reference_dtensor = megatron.reference_logprobs(batch), dtensor.reference_logprobs(batch)

    for dtensor_metrics, megatron_metrics in steps:
        assert megatron_metrics["loss"] == pytest.approx(dtensor_metrics["loss"], rel=1e-6)
        assert megatron_metrics["grad_norm"] == pytest.approx(dtensor_metrics["grad_norm"], rel=1e-5)
    torch.testing.assert_close(stepped_megatron, stepped_dtensor, rtol=0, atol=1e-5)
    start, _ = read_adapter(tmp_path / "start")
    trained_dtensor, _ = read_adapter(tmp_path / "dtensor")
    trained_megatron, _ = read_adapter(tmp_path / "megatron")
    assert_same_tensors(trained_megatron, trained_dtensor, atol=1e-6)
    assert all(not torch.equal(trained_megatron[k], start[k]) for k in start)  # every A and B moved

    assert not torch.allclose(same_megatron, base, atol=1e-3)
    torch.testing.assert_close(same_megatron, same_dtensor, rtol=0, atol=1e-5)
    torch.testing.assert_close(logits_megatron[0], logits_dtensor[0], rtol=0, atol=1e-5)
    assert torch.equal(logits_megatron[1], logits_dtensor[1])

    # (d) the PEFT layout of the DTensor backend: same names, config and (here loaded) values
    copied, config = read_adapter(tmp_path / "megatron_copy")
    _, dtensor_config = read_adapter(tmp_path / "dtensor")
    assert config == dtensor_config and config["target_modules"] == sorted(LORA["target_modules"])
    assert_same_tensors(copied, trained_dtensor, atol=0)
    assert "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight" in copied

    assert torch.equal(reference, base)  # the base weights never moved
    torch.testing.assert_close(reference, reference_dtensor, rtol=0, atol=1e-5)


def test_megatron_lora_merged_weights_export_and_resume(gqa_model_dir, skewed_lengths, tmp_path):
    """(c) refit/export weights are W + scale * B @ A in HF names; (e) a checkpoint holds the base
    and the adapters unmerged (rl-checkpoint merges them) and resumes bitwise."""

    from rl_checkpoint import to_hf

    batches = [make_batch(VOCAB, skewed_lengths, seed=s) for s in range(2)]
    cfg = TrainBackendConfig(backend="megatron", **BASE)
    with build_training_backend(cfg, gqa_model_dir) as policy:
        policy.train(batches[0], MaskedNLL())
        saved_weights = dict(policy.named_weights())
        policy.save(str(tmp_path / "ckpt"))
        expected = policy.train(batches[1], MaskedNLL())
        merged = dict(policy.named_weights())
        policy.export_hf(str(tmp_path / "hf"))
        policy.save_adapter(str(tmp_path / "adapter"))
        after = policy.logprobs(batches[1])
    with build_training_backend(cfg, gqa_model_dir) as fresh:
        assert fresh.load(str(tmp_path / "ckpt")) == 1
        assert fresh.train(batches[1], MaskedNLL()) == expected  # bitwise resume
        assert torch.equal(fresh.logprobs(batches[1]), after)

    original = load_file(f"{gqa_model_dir}/model.safetensors")
    adapter, _ = read_adapter(tmp_path / "adapter")
    assert merged.keys() == original.keys()  # HF names, adapters folded in and left out
    for name, weight in original.items():
        if not name.endswith(TARGETED):
            assert torch.equal(merged[name], weight), name
            continue
        module = f"base_model.model.{name.removesuffix('.weight')}"
        a, b = adapter[f"{module}.lora_A.weight"], adapter[f"{module}.lora_B.weight"]
        torch.testing.assert_close(merged[name], weight + SCALE * b @ a, rtol=0, atol=1e-6, msg=name)

    assert_export_scores_like(tmp_path / "hf", batches[1], after)

    from torch.distributed.checkpoint import FileSystemReader

    keys = set(FileSystemReader(str(tmp_path / "ckpt" / "dcp")).read_metadata().state_dict_metadata)
    assert {"model.model.layers.1.mlp.down_proj.weight", "model.model.layers.1.mlp.down_proj.lora_B.weight",
            "model.model.layers.0.self_attn.q_proj.lora_A.weight"} <= keys
    assert not any("k_proj.lora" in k or "gate_proj.lora" in k for k in keys)
    converted = load_file(to_hf(tmp_path / "ckpt", tmp_path / "converted") / "model-00001-of-00001.safetensors")
    assert_same_tensors(converted, saved_weights, atol=1e-6)


def test_megatron_lora_tensor_parallel_2_equals_1(ray_session, gqa_model_dir, skewed_lengths, tmp_path):
    """TP 2 over gloo: B split with the column-parallel qkv / fc1 rows, A with the row-parallel proj /
    fc2 columns (its partial product all-reduced). Same initial adapters, logits, step, merged
    weights and PEFT files as TP 1; a TP 2 checkpoint resumes on one rank."""
    batch, next_batch = make_batch(VOCAB, skewed_lengths[:4]), make_batch(VOCAB, skewed_lengths[4:], seed=1)
    random_adapter(tmp_path / "random", gqa_model_dir)
    tp2 = TrainBackendConfig(backend="megatron", **(BASE | {"use_ray": True, "num_workers": 2,
                                                           "tensor_parallel_size": 2, "weights_bucket_bytes": 20_000}))
    tp1 = TrainBackendConfig(backend="megatron", **BASE)
    results = {}
    for size, cfg in ((2, tp2), (1, tp1)):
        with build_training_backend(cfg, gqa_model_dir) as policy:
            policy.save_adapter(tmp_path / f"init{size}")
            policy.load_adapter(tmp_path / "random")
            before, reference = policy.logprobs(batch), policy.reference_logprobs(batch)
            metrics = policy.train(batch, MaskedNLL())
            policy.save_adapter(tmp_path / f"trained{size}")
            results[size] = before, reference, metrics, policy.logprobs(batch), dict(policy.named_weights())
            if size == 2:
                policy.save(str(tmp_path / "ckpt"))
                expected_next = policy.train(next_batch, MaskedNLL())
                expected_weights = dict(policy.named_weights())
    for name in ("init", "trained"):
        atol = 0 if name == "init" else 1e-6  # the initial A is drawn whole, then split
        assert_same_tensors(read_adapter(tmp_path / f"{name}2")[0], read_adapter(tmp_path / f"{name}1")[0], atol)
    (before_2, reference_2, metrics_2, after_2, weights_2), (before_1, reference_1, metrics_1, after_1, weights_1) = (
        results[2], results[1])
    torch.testing.assert_close(before_2, before_1, rtol=0, atol=1e-5)
    torch.testing.assert_close(reference_2, reference_1, rtol=0, atol=1e-5)
    assert not torch.allclose(before_1, reference_1, atol=1e-3)
    assert metrics_2["loss"] == pytest.approx(metrics_1["loss"], rel=1e-6)
    assert metrics_2["grad_norm"] == pytest.approx(metrics_1["grad_norm"], rel=1e-5)
    torch.testing.assert_close(after_2, after_1, rtol=0, atol=1e-5)
    assert_same_tensors(weights_2, weights_1, atol=1e-5)

    with build_training_backend(tp1, gqa_model_dir) as resumed:
        assert resumed.load(str(tmp_path / "ckpt")) == 1
        next_step = resumed.train(next_batch, MaskedNLL())
        weights = dict(resumed.named_weights())
    assert next_step["loss"] == pytest.approx(expected_next["loss"], rel=1e-6)
    assert_same_tensors(weights, expected_weights, atol=1e-5)


def test_megatron_lora_config_errors(tiny_model_dir, tmp_path):
    from pydantic import ValidationError

    from rl_core.cluster.errors import WorkerError

    cfg = TrainBackendConfig(backend="megatron", use_ray=False, lora={"rank": 2, "target_modules": ["q_proj", "lm_head"]})
    with pytest.raises(ValueError, match=r"does not support: lora.target_modules \['lm_head'\]"):
        build_training_backend(cfg, tiny_model_dir)
    with pytest.raises(ValidationError, match="not supported by backend=dtensor.*backend=megatron"):
        TrainBackendConfig(num_workers=2, tensor_parallel_size=2, lora={"rank": 2})
    assert TrainBackendConfig(backend="megatron", num_workers=2, tensor_parallel_size=2, lora={"rank": 2}).lora
    with build_training_backend(TrainBackendConfig(backend="megatron", **BASE), tiny_model_dir) as policy:
        with pytest.raises(WorkerError, match="does not match policy.lora"):
            other = LoRAConfig(**(LORA | {"rank": 2}))
            write_adapter(tmp_path / "rank2", {}, adapter_config(other, tiny_model_dir, "causal_lm"))
            policy.load_adapter(tmp_path / "rank2")


def test_megatron_lora_with_recompute_gives_the_same_step(tiny_model_dir, skewed_lengths, tmp_path):
    """Megatron's recompute is reentrant: the frozen embedding's output is made to require grad so
    that the adapters inside recomputed layers still get their gradient."""
    batch = make_batch(VOCAB, skewed_lengths)
    for recompute in (False, True):
        cfg = TrainBackendConfig(backend="megatron", activation_checkpointing=recompute, **BASE)
        with build_training_backend(cfg, tiny_model_dir) as policy:
            policy.train(batch, MaskedNLL())
            policy.save_adapter(tmp_path / str(recompute))
    plain, recomputed = read_adapter(tmp_path / "False")[0], read_adapter(tmp_path / "True")[0]
    assert any(t.abs().max() > 0 for name, t in recomputed.items() if "lora_B" in name)
    assert_same_tensors(recomputed, plain, atol=1e-6)
