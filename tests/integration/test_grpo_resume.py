"""Kill -9 a `rl grpo` run after its first checkpoint, resume it, and get the uninterrupted run's metrics.jsonl."""

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


def command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rl_apps.cli", "grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"),
            f"output_dir={out}", f"grpo.max_steps={STEPS}", "grpo.val_every=2", "checkpointing.every_n_steps=2",
            "logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false", *extra]


def last_step(out: Path) -> int:
    return max((record["step"] for record in read_jsonl_metrics(out / "metrics.jsonl")), default=0)


@pytest.mark.slow
def test_kill_and_resume_ends_with_the_same_metrics(tmp_path, metrics_lines):
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
    assert last_step(killed) < STEPS, "the run finished before it was killed"

    resumed = subprocess.run(command(killed, "checkpointing.resume=true"), env=env, check=True, timeout=600,
                             capture_output=True, text=True)
    assert f"resumed from {killed / 'checkpoints'}" in resumed.stdout
    expected = metrics_lines(straight)
    assert any("train/loss" in line for line in expected) and any("val/accuracy" in line for line in expected)
    assert metrics_lines(killed) == expected
