"""offload() / onload() around a phase that needs the device (colocated generation), and memory
figures: on CPU the bookkeeping (gradients freed, state and weights where they belong, a step after
the round trip equal to one without it, operations onloading by themselves); the GPU memory drop is
checked in test_dtensor_gpu.py."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch

from rl_backends_train import TrainBackendConfig, build_training_backend

VOCAB = 500
BASE = {"use_ray": False, "optimizer": {"lr": 1e-3, "eps": 1e-3}, "reference_model": True}


def _worker(policy):
    return policy.group._local.worker  # the in-process rank, to look at where its tensors live


def _optimizer_state(worker) -> list[torch.Tensor]:
    return [v for opt in worker.optimizers for state in opt.state.values() for v in state.values()
            if torch.is_tensor(v)]


def _run(cfg, model_dir, batches, offload: str | None):
    """Two steps; between them the state is offloaded ("explicit": then onloaded; "implicit": the next
    operation onloads)."""
    with build_training_backend(cfg, model_dir, seed=3) as policy:
        first = policy.train(batches[0], MaskedNLL())
        if offload is not None:
            policy.offload(weights=True)
            worker = _worker(policy)
            assert all(p.grad is None for p in worker.model.parameters())  # freed: each step zeroes them
            state = _optimizer_state(worker)
            assert state and all(t.device.type == "cpu" for t in state)
            assert all(p.device.type == "cpu" for p in worker.model.parameters())
            memory = policy.memory_metrics()
            assert memory["cpu_rss_gib"] > 0.1
            if offload == "explicit":
                policy.onload()
                devices = {p: p.device for p in worker.model.parameters()}
                for opt in worker.optimizers:
                    for param, param_state in opt.state.items():
                        assert all(v.device == devices[param] for k, v in param_state.items()
                                   if torch.is_tensor(v) and k != "step"), "state back beside its parameter"
        reference = policy.reference_logprobs(batches[1])
        second = policy.train(batches[1], MaskedNLL())
        return first, second, reference, dict(policy.named_weights())


@pytest.mark.parametrize("backend", ["dtensor", "megatron"])
def test_offload_onload_round_trip_is_exact(backend, tiny_model_dir, skewed_lengths):
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    cfg = TrainBackendConfig(backend=backend, **BASE)
    batches = [make_batch(VOCAB, skewed_lengths, seed=s) for s in (0, 1)]
    plain = _run(cfg, tiny_model_dir, batches, offload=None)
    for mode in ("explicit", "implicit"):
        first, second, reference, weights = _run(cfg, tiny_model_dir, batches, offload=mode)
        assert first == plain[0] and second == plain[1], mode
        assert torch.equal(reference, plain[2]), mode
        for name, tensor in plain[3].items():
            assert torch.equal(weights[name], tensor), f"{mode} {name}"


def test_memory_metrics_name_the_figures(tiny_model_dir):
    with build_training_backend(TrainBackendConfig(**BASE), tiny_model_dir) as policy:
        figures = policy.memory_metrics()
    expected = {"cpu_rss_gib"} | ({"gpu_allocated_gib", "gpu_reserved_gib", "gpu_peak_gib"}
                                  if torch.cuda.is_available() else set())
    assert set(figures) == expected and all(v >= 0 for v in figures.values())
