"""`max_minutes`: the loop's training-time budget (validation time not counted; a resumed run counts the
steps before the resume), on a fake clock so the arithmetic is exact."""

from __future__ import annotations

import time

import pytest

import rl_algorithms.loop as loop
from rl_algorithms.loop import LoopConfig, train_loop


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Data:
    epoch = 0


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


def run(cfg: LoopConfig, clock: Clock, step_s: float = 30.0, validate_s: float = 100.0):
    steps, validated = [], []

    def train_step(step, timer):
        steps.append(step)
        clock.now += step_s
        return {"loss": 1.0}

    def validate(step):
        validated.append(step)
        clock.now += validate_s  # never counted against the budget
        return {"accuracy": 0.5}

    history = train_loop(cfg, policy=None, data=Data(), train_step=train_step, validate=validate)
    return steps, validated, history


def test_the_step_that_spends_the_budget_is_the_last_and_validates(clock):
    cfg = LoopConfig(max_steps=100, max_minutes=2.0, val_every=3)
    steps, validated, history = run(cfg, clock)
    assert steps == [0, 1, 2, 3]  # 4 x 30 s = 2 minutes; validation (100 s each) is not counted
    assert validated == [0, 3, 4]  # every 3 steps, and the last step as max_steps would have it
    assert loop.last_step(history) == 4
    assert [loop.training_seconds(m) for m in history[1:]] == [30.0] * 4


def test_without_a_budget_max_steps_ends_the_run(clock):
    steps, validated, history = run(LoopConfig(max_steps=5, val_every=0), clock)
    assert steps == [0, 1, 2, 3, 4] and validated == [] and loop.last_step(history) == 5


def test_a_resumed_run_counts_the_training_time_before_it(clock, monkeypatch):
    earlier = [{"step": 0.0, "val/accuracy": 0.1}] + [
        {"step": float(s), "train/time/total": 130.0, "train/time/validate": 100.0} for s in (1, 2, 3)]
    monkeypatch.setattr(loop, "maybe_resume", lambda *a, **k: (3, list(earlier)))
    steps, _, history = run(LoopConfig(max_steps=100, max_minutes=2.0, val_every=0), clock)
    assert steps == [3]  # 90 s before the resume + 30 s = the budget
    assert loop.last_step(history) == 4
    spent = [{"step": float(s), "train/time/total": 40.0} for s in (1, 2, 3)]
    monkeypatch.setattr(loop, "maybe_resume", lambda *a, **k: (3, list(spent)))
    steps, _, history = run(LoopConfig(max_steps=100, max_minutes=2.0, val_every=0), clock)
    assert steps == [] and loop.last_step(history) == 3  # 120 s already spent: nothing more runs


def test_max_minutes_must_be_positive():
    with pytest.raises(ValueError, match="max_minutes"):
        LoopConfig(max_minutes=0)
