"""Megatron-core on CUDA: one forward and one optimizer step equal the DTensor backend's (fp32)."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch
from safetensors.torch import load_file

from rl_backends_train import TrainBackendConfig, build_training_backend

pytestmark = pytest.mark.gpu

VOCAB = 500
BASE = {"use_ray": False, "optimizer": {"lr": 1e-3, "eps": 1e-3}, "reference_model": False}


def test_megatron_forward_and_step_equal_dtensor_on_cuda(tiny_model_dir):
    pytest.importorskip("megatron.core")
    batch = make_batch(VOCAB, [40, 5, 12, 33, 7, 9, 25, 6])
    backends = [build_training_backend(TrainBackendConfig(backend=name, **BASE), tiny_model_dir)
                for name in ("dtensor", "megatron")]
    try:
        before = [backend.logprobs(batch) for backend in backends]
        steps = [backend.train(batch, MaskedNLL()) for backend in backends]
        after = [backend.logprobs(batch) for backend in backends]
        weights = [dict(backend.named_weights()) for backend in backends]
    finally:
        for backend in backends:
            backend.shutdown()
    torch.testing.assert_close(before[1], before[0], rtol=0, atol=1e-4)  # [B, T] logprobs, megatron vs dtensor
    assert steps[1]["loss"] == pytest.approx(steps[0]["loss"], rel=1e-5)
    assert steps[1]["grad_norm"] == pytest.approx(steps[0]["grad_norm"], rel=1e-4)
    torch.testing.assert_close(after[1], after[0], rtol=0, atol=1e-4)
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert weights[0].keys() == weights[1].keys() == initial.keys()
    assert all(not torch.equal(weights[0][n], initial[n]) for n in initial if n.endswith("q_proj.weight"))  # it moved
    for name in initial:
        torch.testing.assert_close(weights[1][name], weights[0][name], rtol=0, atol=1e-5, msg=name)
