"""Checkpoint integrity and run identity: every damage kind is named and skipped on resume, checksums
catch silent corruption, pruning and resume keep to this run's checkpoints (real tiny DTensor policy)."""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch
from checkpoint_testlib import DAMAGE, policy_fixture  # noqa: F401 (provides the `policy` fixture)

from rl_algorithms.checkpointing import STATE_FILE, CheckpointConfig, CheckpointError, CheckpointManager


def _save(manager, step, policy):
    torch.manual_seed(100 + step)  # each checkpoint's RNG state tells which one was loaded
    return manager.save(step, policy, {"data": {"consumed": step}})


def _next_rand_after(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.rand(3)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "no-manifest"])
def test_damaged_checkpoint_is_named_and_resume_falls_back(policy, tmp_path, caplog, kind, manifest):
    manager = CheckpointManager(CheckpointConfig(keep_last=3), tmp_path, run_id="r1")
    _save(manager, 1, policy)
    newest = _save(manager, 2, policy)
    if not manifest:  # as saved before checksums: the structure checks must catch it
        for step_dir in tmp_path.glob("step_*"):
            (step_dir / "manifest.json").unlink()
    rel, damage = DAMAGE[kind]
    damage(newest / rel)

    with pytest.raises(CheckpointError) as info:
        manager.load(newest, policy)
    message = str(info.value)
    assert "\n" not in message
    assert str(newest / rel) in message or (kind == "missing-shard" and str(newest / "policy" / "dcp") in message)
    if kind == "flipped-tensor-bytes":
        assert "damaged tensor" in message and "model." in message

    with caplog.at_level(logging.WARNING, logger="rl_algorithms.checkpointing"):
        path, state = manager.resume(policy)
    assert path.name == "step_000001" and state["step"] == 1 and state["data"] == {"consumed": 1}
    assert torch.equal(torch.rand(3), _next_rand_after(101))
    assert any("step_000002 is damaged" in r.message for r in caplog.records)


def test_every_checkpoint_damaged_is_an_error(policy, tmp_path):
    manager = CheckpointManager(CheckpointConfig(), tmp_path, run_id="r1")
    for step in (1, 2):
        (_save(manager, step, policy) / "rng.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="every checkpoint is damaged"):
        manager.resume(policy)


def test_manifest_lists_every_file_and_old_checkpoints_load_with_a_warning(policy, tmp_path, caplog):
    manager = CheckpointManager(CheckpointConfig(), tmp_path, run_id="r1")
    path = _save(manager, 3, policy)
    listed = json.loads((path / "manifest.json").read_text())["files"]
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(listed) == on_disk and {"rng.pt", STATE_FILE, "policy/meta.json"} <= on_disk
    assert json.loads((path / STATE_FILE).read_text())["run_id"] == "r1"
    (path / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="rl_algorithms.checkpointing"):
        assert manager.load(path, policy)["step"] == 3
    assert any("no manifest.json" in r.message for r in caplog.records)


def test_pruning_keeps_to_this_run(policy, tmp_path):
    first = CheckpointManager(CheckpointConfig(keep_last=2), tmp_path, run_id="a")
    for step in range(1, 5):
        _save(first, step, policy)
    second = CheckpointManager(CheckpointConfig(keep_last=2), tmp_path, run_id="b")
    _save(second, 1, policy)  # used to be pruned at once: step 1 is older than the first run's 3 and 4
    assert [s for s, _ in second.checkpoints()] == [1]
    assert [s for s, _ in first.checkpoints()] == [3, 4]
    with pytest.raises(CheckpointError, match="belongs to run 'a'"):
        _save(second, 3, policy)  # would replace the first run's checkpoint
    assert [s for s, _ in first.checkpoints()] == [3, 4]


def test_resume_refuses_another_runs_checkpoints(policy, tmp_path):
    CheckpointManager(CheckpointConfig(), tmp_path, run_id="a").save(4, policy, {})
    other = CheckpointManager(CheckpointConfig(resume=True), tmp_path, run_id="b")
    with pytest.raises(CheckpointError) as info:
        other.resume(policy)
    assert "step_000004: belongs to run 'a', not to this run ('b')" in str(info.value)
    assert "new output_dir" in str(info.value)
    _save(other, 2, policy)  # once this run has its own, it resumes from those (not the other run's newer one)
    path, state = other.resume(policy)
    assert path.name == "step_000002" and state["run_id"] == "b"


def test_hashing_is_cheap(tmp_path):
    """sha256 of the manifest streams: ~50 MB of checkpoint must hash well within a second."""
    from rl_checkpoint.integrity import verify, write_manifest

    torch.save({"w": torch.randn(13_000_000)}, tmp_path / "weights.pt")
    start = time.perf_counter()
    write_manifest(tmp_path)
    assert verify(tmp_path).bytes > 50e6
    assert time.perf_counter() - start < 2.0


def test_rl_checkpoint_converts_a_real_checkpoint_of_the_run(policy, tmp_path):
    """The manager's layout, as the DTensor backend writes it, is what rl-checkpoint reads: the run
    directory's latest checkpoint converts to the policy's weights, checksums verified."""
    from safetensors.torch import load_file

    from rl_checkpoint import hf_model_dir
    from rl_checkpoint.cli import main

    manager = CheckpointManager(CheckpointConfig(), tmp_path / "run" / "checkpoints", run_id="r1")
    _save(manager, 5, policy)
    assert main(["dcp-to-hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    exported = {k: v for f in (tmp_path / "hf").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    weights = dict(policy.named_weights())
    assert sorted(exported) == sorted(weights)
    assert all(torch.equal(exported[k], weights[k]) for k in weights)
    assert hf_model_dir(tmp_path / "run") == tmp_path / "run" / "checkpoints" / "step_000005" / "hf"


def test_hf_to_dcp_output_starts_a_run_but_is_not_resumed(policy, tiny_model_dir, tmp_path):
    from rl_backends_train import TrainBackendConfig, build_training_backend
    from rl_checkpoint import hf_model_dir, hf_to_dcp
    from rl_core.models import resolve_model

    hf_to_dcp(tiny_model_dir, tmp_path / "start")
    with pytest.raises(RuntimeError) as info:  # the worker group's WorkerError, caused by the rank's error
        policy.load(str(tmp_path / "start"))
    cause = info.value.__cause__
    assert isinstance(cause, ValueError) and "\n" not in str(cause)
    assert str(cause) == (f"{tmp_path / 'start'}: holds model weights only (written by `rl-checkpoint hf-to-dcp`), "
                          f"no optimizer, scheduler or trainer state to resume; start a run from it with "
                          f"model={tmp_path / 'start'}")

    model_path = resolve_model(str(tmp_path / "start"), checkpoint_to_hf=hf_model_dir)  # what model=... does
    fresh = build_training_backend(TrainBackendConfig(use_ray=False, reference_model=False), model_path)
    try:
        started, original = dict(fresh.named_weights()), dict(policy.named_weights())
        assert sorted(started) == sorted(original)
        assert all(torch.equal(started[k], original[k]) for k in original)
    finally:
        fresh.shutdown()
