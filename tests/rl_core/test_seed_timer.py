"""Seeding, exact RNG save/restore through torch.save, and the phase timer."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from rl_core.seed import get_rng_state, set_rng_state, set_seed
from rl_core.timer import Timer


def draw() -> tuple:
    return (random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(4).tolist(),
            torch.randint(0, 1000, (3,)).tolist())


def test_set_seed_makes_every_generator_repeat():
    set_seed(1234)
    first = draw()
    set_seed(1234)
    assert draw() == first
    set_seed(1235)
    assert draw() != first


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    set_seed(7)
    draw()
    np.random.randn()  # leaves a cached gaussian in numpy's legacy state
    torch.save(get_rng_state(), tmp_path / "rng.pt")
    expected = [draw() for _ in range(3)]
    set_seed(99)  # a different run in between
    draw()
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert [draw() for _ in range(3)] == expected


def test_set_rng_state_rejects_foreign_dicts():
    with pytest.raises(ValueError, match="missing"):
        set_rng_state({"python": random.getstate()})


def test_timer_accumulates_phases_and_resets_on_pop():
    timer = Timer()
    with timer.time("generate"):
        time.sleep(0.02)
    with timer.time("generate"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError), timer.time("train"):
        raise RuntimeError("timed even when raising")
    timer.add("refit", 1.5)
    times = timer.pop()
    assert set(times) == {"time/generate", "time/train", "time/refit", "time/total"}
    assert times["time/generate"] >= 0.04
    assert times["time/refit"] == 1.5
    assert times["time/total"] >= times["time/generate"] + times["time/train"]
    assert set(timer.pop()) == {"time/total"}
