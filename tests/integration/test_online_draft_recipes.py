"""`rl grpo` and `rl distill` with generation.speculative.train_draft on the tiny model: every step logs the
draft's distillation loss next to the acceptance rate of that step's rollouts; the run's checkpoints carry
the draft (a resumed run goes on with it) and the run ends by saving it as an HF model."""

from __future__ import annotations

import math
import os
import shutil

from safetensors.torch import load_file

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_core.logging import read_jsonl_metrics

ONLINE_DRAFT = ["generation.speculative.method=draft", "generation.speculative.draft_model=policy_layers:1",
                "generation.speculative.train_draft=true",
                "generation.speculative.max_batch_rows=4096"]  # speculate at every step (tiny batches)


def assert_draft_metrics(records: list[dict], steps: list[int]) -> None:
    train = [r for r in records if "train/draft/distill_loss" in r]
    assert [r["step"] for r in train] == steps
    for record in train:
        # every step speculated (proposals were made); acceptance of argmax proposals from a random tiny
        # model at T=1 may be 0 (its rise is tested greedily in tests/rl_algorithms/test_online_draft.py)
        assert record["train/speculative/speculative_step_share"] == 1.0
        assert record["train/speculative/proposed_tokens"] > 0
        assert 0 <= record["train/speculative/acceptance_rate"] <= 1
        assert record["train/draft/tokens"] > 0 and record["train/draft/train_seconds"] > 0
        assert math.isfinite(record["train/draft/distill_loss"]) and record["train/draft/distill_loss"] > 0


def test_grpo_smoke_with_an_online_draft_logs_its_metrics(tmp_path):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path / "rl-cache"))
    code = main(["grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 "grpo.max_steps=2", "grpo.val_every=2", "logger.progress_bar=false",
                 "checkpointing.save_at_end=false", *ONLINE_DRAFT])
    assert code == 0
    assert_draft_metrics(read_jsonl_metrics(tmp_path / "run" / "metrics.jsonl"), [1, 2])


def test_on_policy_distillation_trains_the_draft_too(tmp_path):
    """... with a draft vocabulary (64 of the tiny model's 512 tokens): its coverage is logged too."""
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path / "rl-cache"))
    code = main(["distill", "--config", recipe_path("distill_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 "distill.max_steps=2", "distill.val_every=2", "checkpointing.save_at_end=false", *ONLINE_DRAFT,
                 "generation.speculative.draft_vocab_size=64"])
    assert code == 0
    records = read_jsonl_metrics(tmp_path / "run" / "metrics.jsonl")
    assert_draft_metrics(records, [1, 2])
    coverage = [r["train/speculative/draft_vocab_coverage"] for r in records if "train/draft/distill_loss" in r]
    assert len(coverage) == 2 and all(0 < c <= 1 for c in coverage)


DRAFT_KEYS = ("train/draft/distill_loss", "train/draft/distill_loss_last", "train/draft/tokens",
              "train/speculative/proposed_tokens", "train/speculative/accepted_tokens")
"""What a step logs of its draft, wall-clock measurements left out."""


def test_a_resumed_run_goes_on_with_the_draft_its_checkpoint_kept(tmp_path, rl):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path / "rl-cache"))
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = ["grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"), "grpo.max_steps=3", "grpo.val_every=0",
            "logger.progress_bar=false", "checkpointing.every_n_steps=1", "checkpointing.keep_last=3", *ONLINE_DRAFT]
    result = rl(*args, f"output_dir={straight}")
    assert result.code == 0 and f"speculative draft saved to {straight / 'draft'}" in result.out
    # the run stopped after step 2: its last checkpoint is step 2's
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000003")
    shutil.rmtree(resumed / "draft")
    assert (resumed / "checkpoints" / "step_000002" / "draft.pt").is_file()
    result = rl(*args, f"output_dir={resumed}", "checkpointing.resume=true")
    assert result.code == 0 and "resumed from" in result.out

    def step3(out):
        (record,) = [r for r in read_jsonl_metrics(out / "metrics.jsonl") if r["step"] == 3 and DRAFT_KEYS[0] in r]
        return {key: record[key] for key in DRAFT_KEYS}

    assert step3(resumed) == step3(straight)  # a draft started over at step 3 is far from the policy
    ours, theirs = load_file(straight / "draft" / "model.safetensors"), load_file(resumed / "draft" / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(ours[name].equal(theirs[name]) for name in ours)
