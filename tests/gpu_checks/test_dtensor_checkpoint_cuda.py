"""DTensor backend on CUDA: a DCP checkpoint saved after one step loads back exactly and resumes."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch

from rl_backends_train import TrainBackendConfig, build_training_backend

pytestmark = pytest.mark.gpu

VOCAB = 500


def test_dcp_save_load_on_cuda_resumes(tiny_model_dir, tmp_path):
    batches = [make_batch(VOCAB, [40, 5, 12, 33, 7, 9, 25, 6], seed=s) for s in range(3)]
    cfg = TrainBackendConfig(use_ray=False, reference_model=False, optimizer={"lr": 1e-3, "weight_decay": 0.01},
                             scheduler={"kind": "cosine", "warmup_steps": 1, "total_steps": 4})
    with build_training_backend(cfg, tiny_model_dir) as policy:
        policy.train(batches[0], MaskedNLL())
        saved_weights = dict(policy.named_weights())
        policy.save(str(tmp_path / "ckpt"))
        expected = [policy.train(b, MaskedNLL()) for b in batches[1:]]
    assert {"dcp", "meta.json", "trainer_state"} <= {p.name for p in (tmp_path / "ckpt").iterdir()}
    with build_training_backend(cfg, tiny_model_dir) as fresh:
        assert fresh.load(str(tmp_path / "ckpt")) == 1
        loaded_weights = dict(fresh.named_weights())
        resumed = [fresh.train(b, MaskedNLL()) for b in batches[1:]]
    for name, tensor in saved_weights.items():
        assert torch.equal(loaded_weights[name], tensor), name  # the checkpoint holds the exact weights
    # CUDA's embedding backward accumulates with atomics (order not fixed): equal to float rounding.
    for want, got in zip(expected, resumed):
        assert got["lr"] == want["lr"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
