"""Fixtures for rl-checkpoint tests: tiny HF checkpoints and helpers to read safetensors dirs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def read_hf_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in ``path``."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        out |= load_file(str(file))
    return out


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="session")
def read_hf():
    return read_hf_dir


@pytest.fixture(scope="session")
def same_tensors():
    return assert_same_tensors


@pytest.fixture(params=["llama", "qwen2"])
def tiny_hf(request, tiny_model_dir, tiny_qwen2_dir) -> Path:
    """A tiny HF Llama (head_dim 32, GQA) or Qwen2 (q/k/v biases) directory."""
    return Path(tiny_model_dir if request.param == "llama" else tiny_qwen2_dir)
