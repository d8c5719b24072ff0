"""Shared by the checkpoint tests: a real tiny DTensor policy (local, no Ray) and ways to damage a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module", name="policy")
def policy_fixture(tiny_model_dir):
    """Import it into a test module (``from checkpoint_testlib import policy_fixture``) to use ``policy``."""
    from rl_backends_train import TrainBackendConfig, build_training_backend

    backend = build_training_backend(TrainBackendConfig(use_ray=False, reference_model=False), tiny_model_dir)
    yield backend
    backend.shutdown()


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_16_bytes(path: Path) -> None:
    """16 bytes inverted in the middle of the file (inside a tensor's data for a DCP data file)."""
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle:middle + 16] = bytes(b ^ 0xFF for b in raw[middle:middle + 16])
    path.write_bytes(bytes(raw))


DAMAGE = {
    # name: (file under the step directory, what is done to it)
    "truncated-shard": ("policy/dcp/__0_0.distcp", _truncate),
    "missing-shard": ("policy/dcp/__0_0.distcp", Path.unlink),
    "flipped-tensor-bytes": ("policy/dcp/__0_0.distcp", _flip_16_bytes),
    "garbage-metadata": ("policy/dcp/.metadata", lambda p: p.write_bytes(b"\x80\x04garbage")),
    "garbage-trainer-state": ("trainer_state.json", lambda p: p.write_text('{"step": 2, "dat')),
    "garbage-rng": ("rng.pt", lambda p: p.write_bytes(b"PK\x03\x04 not a zip")),
    "garbage-meta": ("policy/meta.json", lambda p: p.write_text("{nope")),
    "garbage-rank-state": ("policy/trainer_state/rank_0.pt", _flip_16_bytes),
}
