"""`rl grpo` with its environment in Ray actors (grpo.env_runner.kind=ray) trains exactly like with threads."""

from __future__ import annotations

import os

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_core.logging import read_jsonl_metrics

# Wall-clock measurements differ between any two runs; everything else must match exactly.
NOT_COMPARED = ("train/time/", "train/throughput/", "train/memory/", "timestamp")


def run_smoke(out, *extra: str) -> list[dict]:
    overrides = [f"output_dir={out}", "grpo.max_steps=2", "grpo.val_every=2", "grpo.val_num_prompts=4",
                 "logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false",
                 "checkpointing.enabled=false", *extra]
    assert main(["grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"), *overrides]) == 0
    return [{k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)}
            for r in read_jsonl_metrics(out / "metrics.jsonl")]


def test_ray_environment_actors_train_like_threads(ray_session, tmp_path):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path / "rl-cache"))
    in_threads = run_smoke(tmp_path / "threads")
    on_ray = run_smoke(tmp_path / "ray", "grpo.env_runner={kind: ray, num_workers: 2, cpus_per_worker: 0.5}")
    train = [r for r in on_ray if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in on_ray if "val/accuracy" in r] == [0, 2]  # validation ran through the actors too
    assert all(r["train/env_errors"] == 0.0 and r["train/episodes"] == 16.0 for r in train)
    assert on_ray == in_threads
