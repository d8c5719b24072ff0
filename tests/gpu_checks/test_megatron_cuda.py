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
    with build_training_backend(TrainBackendConfig(**BASE), tiny_model_dir) as dtensor, \
            build_training_backend(TrainBackendConfig(backend="megatron", **BASE), tiny_model_dir) as megatron:
        torch.testing.assert_close(megatron.logprobs(batch), dtensor.logprobs(batch), rtol=0, atol=1e-4)
        a, b = dtensor.train(batch, MaskedNLL()), megatron.train(batch, MaskedNLL())
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        torch.testing.assert_close(megatron.logprobs(batch), dtensor.logprobs(batch), rtol=0, atol=1e-4)
        weights_a, weights_b = dict(dtensor.named_weights()), dict(megatron.named_weights())
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert weights_a.keys() == weights_b.keys() == initial.keys()
    assert all(not torch.equal(weights_a[n], initial[n]) for n in initial if n.endswith("q_proj.weight"))  # it moved
    for name in weights_a:
        torch.testing.assert_close(weights_b[name], weights_a[name], rtol=0, atol=1e-5, msg=name)
