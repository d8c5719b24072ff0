"""Fixtures of the training-backend tests: tiny model dirs; losses live in backend_testlib.py.

Collection works without Ray (the GPU machine's image has none, and ``scripts/gpu_check.sh`` collects
these files): without it, the tests that start Ray workers (those using ``ray_session``) skip."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import backend_testlib  # noqa: E402

try:
    from ray import cloudpickle
except ImportError:
    cloudpickle = None
else:
    # Ray workers cannot import test modules: ship the test losses by value.
    cloudpickle.register_pickle_by_value(backend_testlib)

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    if cloudpickle is not None:
        return
    skip = pytest.mark.skip(reason="needs Ray (not installed)")
    for item in items:
        if "ray_session" in item.fixturenames and _HERE in Path(item.path).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def skewed_lengths() -> list[int]:
    return [40, 5, 12, 33, 7, 9, 25, 6]


@pytest.fixture(scope="session")
def tiny_tp_dir(tmp_path_factory):
    """A tiny Llama with 2 KV heads, so tensor parallel 2 can split them."""
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-llama-kv2"), family="llama", num_key_value_heads=2))


@pytest.fixture(scope="session")
def tiny_mixtral_dir(tmp_path_factory):
    """A tiny Mixtral: Llama attention, 4 SwiGLU experts per layer, top 2 (saved per expert, as HF does)."""
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-mixtral"), family="mixtral"))
