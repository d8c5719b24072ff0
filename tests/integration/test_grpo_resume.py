"""Kill -9 a `rl grpo` run after its first checkpoint, resume it, and get the uninterrupted run's metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_apps import recipe_path
from rl_core.logging import read_jsonl_metrics

STEPS = 4
# Wall-clock and memory measurements differ between any two runs; everything else must match exactly.
NOT_COMPARED = ("train/time/", "train/throughput/", "train/memory/", "timestamp")


def command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rl_apps.cli", "grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"),
            f"output_dir={out}", f"grpo.max_steps={STEPS}", "grpo.val_every=2", "checkpointing.every_n_steps=2",
            "logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false", *extra]


def last_step_metrics(out: Path) -> dict:
    merged: dict = {}
    for record in read_jsonl_metrics(out / "metrics.jsonl"):
        if record["step"] == STEPS:
            merged.update(record)
    return {k: v for k, v in merged.items() if not k.startswith(NOT_COMPARED)}


@pytest.mark.slow
def test_kill_and_resume_ends_with_the_same_metrics(tmp_path):
    env = {**os.environ, "RL_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(command(straight), env=env, check=True, timeout=600, capture_output=True)

    process = subprocess.Popen(command(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    first_checkpoint = killed / "checkpoints" / "step_000002" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not first_checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first_checkpoint.exists(), "the run never wrote its first checkpoint"
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert not last_step_metrics(killed), "the run finished before it was killed"

    subprocess.run(command(killed, "checkpointing.resume=true"), env=env, check=True, timeout=600, capture_output=True)
    expected, resumed = last_step_metrics(straight), last_step_metrics(killed)
    assert "train/loss" in expected and "val/accuracy" in expected
    assert resumed == expected
