"""Fixtures for rl-checkpoint tests: tiny HF checkpoints and helpers to read safetensors dirs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # the helpers in cli_testlib.py


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


def make_run(run_dir: Path, model_dirs: dict[int, str | Path]) -> Path:
    """A training run's layout, as rl_algorithms.checkpointing writes it, for each ``{step: HF model dir}``:
    ``<run_dir>/checkpoints/step_<NNNNNN>/{policy/, rng.pt, trainer_state.json, manifest.json}``."""
    import json

    from rl_checkpoint import hf_to_dcp, write_manifest

    for step, model in model_dirs.items():
        step_dir = run_dir / "checkpoints" / f"step_{step:06d}"
        hf_to_dcp(model, step_dir / "policy")
        (step_dir / "policy" / "manifest.json").unlink()  # the step's manifest covers policy/
        meta = json.loads((step_dir / "policy" / "meta.json").read_text())
        meta.pop("weights_only")
        (step_dir / "policy" / "meta.json").write_text(json.dumps(meta | {"task": "causal_lm", "lora": None}))
        torch.save({"torch": torch.get_rng_state()}, step_dir / "rng.pt")
        (step_dir / "trainer_state.json").write_text(json.dumps({"step": step, "run_id": "r1"}))
        write_manifest(step_dir)
    return run_dir


@pytest.fixture
def tiny_run(tmp_path, tiny_model_dir, tiny_qwen2_dir) -> Path:
    """``runs/grpo`` with complete checkpoints at steps 3 (tiny Qwen2) and 5 (tiny Llama), an
    interrupted save at step 7 (no trainer_state.json) and a killed one (``.step_000008.tmp``)."""
    run = make_run(tmp_path / "runs" / "grpo", {3: tiny_qwen2_dir, 5: tiny_model_dir})
    (run / "checkpoints" / "step_000007" / "policy").mkdir(parents=True)
    (run / "checkpoints" / ".step_000008.tmp").mkdir()
    return run
