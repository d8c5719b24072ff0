"""GPU paths of the DTensor backend (skipped without CUDA): bf16 compute with fp32 reductions, offload."""

from __future__ import annotations

import gc

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch

from rl_backends_train import TrainBackendConfig, build_training_backend

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cpu_offload", [False, True])
def test_bf16_mixed_precision_step_tracks_fp32(tiny_model_dir, skewed_lengths, cpu_offload):
    batch = make_batch(500, skewed_lengths)
    common = {"use_ray": False, "reference_model": False, "optimizer": {"lr": 1e-3}, "gpus_per_worker": 1}
    with build_training_backend(TrainBackendConfig(**common), tiny_model_dir) as fp32, \
            build_training_backend(TrainBackendConfig(**common, dtype="bfloat16", cpu_offload=cpu_offload),
                                   tiny_model_dir) as bf16:
        torch.testing.assert_close(bf16.logprobs(batch), fp32.logprobs(batch), rtol=0, atol=5e-2)
        a, b = fp32.train(batch, MaskedNLL()), bf16.train(batch, MaskedNLL())
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-2)
        weights = dict(bf16.named_weights())
    assert all(t.dtype == torch.float32 for t in weights.values())  # fp32 master weights


def test_offload_frees_gpu_memory_and_onload_restores_the_step(tiny_model_dir, skewed_lengths):
    batch = make_batch(500, skewed_lengths)
    cfg = TrainBackendConfig(use_ray=False, reference_model=False, optimizer={"lr": 1e-3}, gpus_per_worker=1,
                             dtype="bfloat16")
    with build_training_backend(cfg, tiny_model_dir, seed=1) as plain:
        expected = [plain.train(batch, MaskedNLL()) for _ in range(2)]
        expected_weights = dict(plain.named_weights())
    # What this process already holds on the GPU (earlier tests' models, the weights above) is not the policy's.
    gc.collect()
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated() / 2**30
    with build_training_backend(cfg, tiny_model_dir, seed=1) as policy:
        first = policy.train(batch, MaskedNLL())
        trained = policy.memory_metrics()
        policy.offload(weights=True)
        offloaded = policy.memory_metrics()
        policy.onload()
        second = policy.train(batch, MaskedNLL())
        weights = dict(policy.named_weights())
    held, left = trained["gpu_allocated_gib"] - baseline, offloaded["gpu_allocated_gib"] - baseline
    assert held > 0 and left < 0.1 * held, (baseline, held, left)
    assert offloaded["gpu_reserved_gib"] <= trained["gpu_reserved_gib"]  # the cache was emptied
    for got, want in zip((first, second), expected):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
