"""Seeding and exact save/restore of every random number generator a run uses."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def get_rng_state() -> dict[str, Any]:
    """The state of every generator ``set_seed`` touches, as plain Python values and tensors, so that
    ``torch.save`` / ``torch.load(weights_only=True)`` round-trip it."""
    _, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generators saved by ``get_rng_state`` so that a resumed run draws the same numbers.

    CUDA states are restored when present and CUDA is available (a checkpoint from a GPU run resumed
    on a CPU keeps its CPU streams exact)."""
    missing = {"python", "numpy", "torch_cpu"} - state.keys()
    if missing:
        raise ValueError(f"RNG state is missing {sorted(missing)}; it must come from rl_core.seed.get_rng_state()")
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    np.random.set_state(("MT19937", numpy_state["key"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])
