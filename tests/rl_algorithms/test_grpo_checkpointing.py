"""Checkpoint manager: atomic saves, keep-last / keep-best pruning, RNG restore (real tiny policy)."""

from __future__ import annotations

import json
import random

import torch
from checkpoint_testlib import policy_fixture  # noqa: F401 (provides the `policy` fixture)

from rl_algorithms.checkpointing import STATE_FILE, CheckpointConfig, CheckpointManager


def test_keep_last_and_best(policy, tmp_path):
    cfg = CheckpointConfig(every_n_steps=1, keep_last=1, keep_best=2, best_metric="val/accuracy")
    manager = CheckpointManager(cfg, tmp_path)
    for step, accuracy in [(1, 0.5), (2, 0.9), (3, 0.1), (4, 0.7), (5, None)]:
        metrics = {} if accuracy is None else {"val/accuracy": accuracy}
        manager.save(step, policy, {"metrics": metrics})
    # last: 5; best two: step 2 (0.9) and step 4 (0.7).
    assert [step for step, _ in manager.checkpoints()] == [2, 4, 5]
    assert manager.latest().name == "step_000005"
    assert json.loads((manager.latest() / STATE_FILE).read_text())["step"] == 5
    assert not list(tmp_path.glob(".*.tmp"))


def test_incomplete_checkpoints_are_ignored_and_rng_restored(policy, tmp_path):
    manager = CheckpointManager(CheckpointConfig(keep_last=3), tmp_path)
    random.seed(7)
    torch.manual_seed(7)
    path = manager.save(3, policy, {"data": {"consumed": 12}})
    expected = (random.random(), torch.rand(3))
    (tmp_path / "step_000009").mkdir()  # a directory without trainer_state.json: not a checkpoint
    (tmp_path / ".step_000010.tmp").mkdir()  # a save that was killed midway
    assert manager.latest() == path
    random.seed(0)
    torch.manual_seed(0)
    state = manager.load(manager.latest(), policy)
    assert state["data"] == {"consumed": 12} and state["step"] == 3
    assert random.random() == expected[0]
    assert torch.equal(torch.rand(3), expected[1])
    manager.save(4, policy, {})
    assert not (tmp_path / ".step_000010.tmp").exists()


def test_should_save():
    manager = CheckpointManager(CheckpointConfig(every_n_steps=3, save_at_end=True), "unused")
    assert [s for s in range(1, 8) if manager.should_save(s, last_step=s == 7)] == [3, 6, 7]
    off = CheckpointManager(CheckpointConfig(enabled=False), "unused")
    assert not off.should_save(3, last_step=True)
