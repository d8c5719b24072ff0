"""A run's directory belongs to one run (issues 17 and 18): a second run into it is refused and writes
nothing, `--overwrite` replaces only the run's own files, a resumed run's metrics.jsonl equals an
uninterrupted run's, another run's checkpoints are never resumed or pruned, a damaged checkpoint falls
back to the one before it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rl_algorithms.checkpointing import CheckpointManager

SFT = ("sft", "--config", "sft_tiny", "sft.val_every=1")
GRPO = ("grpo", "--config", "grpo_smoke_tiny", "grpo.val_every=2", "grpo.val_num_prompts=4")


def sft(rl, out: Path, steps: int, *overrides: str):
    return rl(*SFT, f"output_dir={out}", f"sft.max_steps={steps}", "checkpointing.every_n_steps=1", *overrides)


def run_id(out: Path) -> str:
    return json.loads((out / "run.json").read_text())["run_id"]


def checkpoint_run_id(step_dir: Path) -> str:
    return json.loads((step_dir / "trainer_state.json").read_text())["run_id"]


def test_a_second_run_into_the_same_directory_is_refused_and_changes_nothing(rl, tree, tmp_path):
    out = tmp_path / "run"
    assert sft(rl, out, 1).code == 0
    before = tree(out)
    assert {"run.json", "config.yaml", "metrics.jsonl", "checkpoints", "hf", "data"} <= set(before)

    second = sft(rl, out, 2)
    assert second.code == 2
    [line] = second.error_lines("sft")
    assert "output_dir" in line and "checkpointing.resume=true" in line and "--overwrite" in line
    assert "Traceback" not in second.err
    assert tree(out) == before


def test_overwrite_replaces_the_previous_run_and_nothing_else(rl, metrics_lines, tmp_path):
    out = tmp_path / "run"
    assert sft(rl, out, 3, "checkpointing.keep_last=2").code == 0
    first_id = run_id(out)
    (out / "notes.txt").write_text("mine")
    (out / "data" / "my_rows.jsonl").write_text("{}\n")

    second = sft(rl, out, 1, "--overwrite")
    assert second.code == 0, second.err
    assert run_id(out) != first_id
    assert (out / "notes.txt").read_text() == "mine" and (out / "data" / "my_rows.jsonl").exists()
    assert [line["step"] for line in metrics_lines(out)] == [0, 1, 1]  # val at 0; train + val at 1
    # The old run's step_000002/3 are gone with it; this run's checkpoint is its own.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    assert checkpoint_run_id(out / "checkpoints" / "step_000001") == run_id(out)


def test_overwrite_never_removes_the_model_the_run_reads(rl, tree, tmp_path):
    out = tmp_path / "run"
    assert sft(rl, out, 1).code == 0
    before = tree(out)
    result = sft(rl, out, 1, "--overwrite", f"model={out}")
    assert result.code == 2
    [line] = result.error_lines("sft")
    assert "model:" in line and "--overwrite would remove" in line
    assert tree(out) == before


def test_overwrite_is_refused_where_there_is_no_run_directory(rl):
    result = rl("eval", "--config", "eval_tiny", "--overwrite")
    assert result.code == 2
    assert result.error_lines("eval") == ["rl eval: --overwrite: this command writes no run directory"]


def interrupt_at_save(monkeypatch, step: int) -> None:
    """Ctrl-C while checkpoint ``step`` is being saved: its metrics are logged, the checkpoint is not."""
    save = CheckpointManager.save

    def save_or_stop(self, done, policy, state, files=None):
        if done == step:
            raise KeyboardInterrupt
        return save(self, done, policy, state, files)

    monkeypatch.setattr(CheckpointManager, "save", save_or_stop)


@pytest.mark.parametrize("command", [SFT, GRPO], ids=["sft", "grpo"])
def test_resumed_run_logs_what_an_uninterrupted_run_logs(command, rl, metrics_lines, monkeypatch, tmp_path):
    steps = ("sft.max_steps=3",) if command is SFT else ("grpo.max_steps=3",)
    args = (*command, *steps, "checkpointing.every_n_steps=2", "checkpointing.keep_last=null")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert rl(*args, f"output_dir={straight}").code == 0

    with monkeypatch.context() as patch:
        interrupt_at_save(patch, 3)
        assert rl(*args, f"output_dir={killed}").code == 130
    assert max(line["step"] for line in metrics_lines(killed)) == 3  # step 3 was logged, not checkpointed

    resumed = rl(*args, f"output_dir={killed}", "checkpointing.resume=true")
    assert resumed.code == 0, resumed.err
    assert f"resumed from {killed / 'checkpoints' / 'step_000002'} at step 2" in resumed.out.splitlines()
    assert metrics_lines(killed) == metrics_lines(straight)


def test_resume_before_the_first_checkpoint_starts_over(rl, metrics_lines, monkeypatch, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert sft(rl, straight, 2).code == 0
    with monkeypatch.context() as patch:
        interrupt_at_save(patch, 1)
        assert sft(rl, killed, 2).code == 130
    assert [line["step"] for line in metrics_lines(killed)] == [0, 1, 1]

    resumed = sft(rl, killed, 2, "checkpointing.resume=true")
    assert resumed.code == 0, resumed.err
    assert "resumed from" not in resumed.out
    assert metrics_lines(killed) == metrics_lines(straight)


def test_resume_refuses_the_checkpoints_of_another_run(rl, tmp_path):
    first = tmp_path / "first"
    assert sft(rl, first, 1).code == 0
    other = tmp_path / "other"
    result = sft(rl, other, 2, f"checkpointing.dir={first / 'checkpoints'}", "checkpointing.resume=true")
    assert result.code == 2
    [line] = result.error_lines("sft")
    assert f"belongs to run '{run_id(first)}'" in line and "new output_dir" in line
    assert not other.exists()

    (first / "run.json").unlink()  # the directory no longer says which run it is
    result = sft(rl, first, 2, "checkpointing.resume=true")
    assert result.code == 2 and "belongs to run" in result.error_lines("sft")[0]


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(rl, metrics_lines, caplog, tmp_path):
    out = tmp_path / "run"
    assert sft(rl, out, 2, "checkpointing.keep_last=2").code == 0
    shard = next((out / "checkpoints" / "step_000002" / "policy" / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])  # truncated

    result = sft(rl, out, 3, "checkpointing.keep_last=2", "checkpointing.resume=true")
    assert result.code == 0, result.err
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "damaged" in r.getMessage()]
    assert f"checkpoint {out / 'checkpoints' / 'step_000002'} is damaged" in warning and f"{shard}: 100 bytes" in warning
    assert f"resumed from {out / 'checkpoints' / 'step_000001'} at step 1" in result.out
    assert [line["step"] for line in metrics_lines(out)] == [0, 1, 1, 2, 2, 3, 3]


def test_keep_last_never_prunes_what_this_run_wrote(rl, tmp_path):
    """Checkpoints of another run with higher step numbers in the same checkpoint directory (here, copied
    in) used to push this run's new checkpoints out at once: pruning counted steps, not owners."""
    out, checkpoints = tmp_path / "run", tmp_path / "checkpoints"
    assert sft(rl, out, 2, f"checkpointing.dir={checkpoints}", "checkpointing.keep_last=2").code == 0
    foreign = tmp_path / "foreign"
    assert sft(rl, foreign, 1).code == 0
    shutil.copytree(foreign / "checkpoints" / "step_000001", checkpoints / "step_000009")

    result = sft(rl, out, 4, f"checkpointing.dir={checkpoints}", "checkpointing.keep_last=2",
                 "checkpointing.resume=true")
    assert result.code == 0, result.err
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000003", "step_000004", "step_000009"]
    assert {checkpoint_run_id(checkpoints / f"step_00000{i}") for i in (3, 4)} == {run_id(out)}
    assert checkpoint_run_id(checkpoints / "step_000009") == run_id(foreign)


def test_a_resume_with_another_model_is_refused_before_anything_loads(rl, tree, tmp_path):
    """The checkpoint's weights are compared with the new model's before loading: one line, exit 2 (was a
    traceback from the checkpoint loader, after config.yaml had been replaced)."""
    from rl_core.models import save_tiny_model

    out = tmp_path / "run"
    assert sft(rl, out, 1).code == 0
    before = tree(out)
    qwen3 = save_tiny_model(tmp_path / "qwen3", family="qwen3")  # q_norm / k_norm: weights the Llama has not
    result = sft(rl, out, 2, f"model={qwen3}", "checkpointing.resume=true")
    assert result.code == 2
    [line] = result.error_lines("sft")
    assert f"model: {qwen3} is not the model of {out / 'checkpoints' / 'step_000001'}" in line
    assert "self_attn.k_norm.weight" in line and "Traceback" not in result.err
    assert tree(out) == before


def test_a_resume_refused_after_its_checkpoint_loaded_keeps_the_run_files(rl, tree, tmp_path):
    """A resume refused once the checkpoint has loaded (here: other training data) leaves config.yaml, run.json
    and the synthetic data of the run as they were; a resume that goes on writes its own config.yaml."""
    out = tmp_path / "run"
    assert sft(rl, out, 1).code == 0
    before = tree(out)
    result = sft(rl, out, 2, "synthetic_data.num_train=16", "checkpointing.resume=true")
    assert result.code == 2
    [line] = result.error_lines("sft")
    assert "written for 8 training items but the data now holds 16" in line
    assert tree(out) == before

    assert sft(rl, out, 2, "checkpointing.resume=true").code == 0
    assert "max_steps: 2" in (out / "config.yaml").read_text() and run_id(out) == json.loads(before["run.json"])["run_id"]


def test_a_resume_that_would_continue_something_else_is_refused_and_changes_nothing(rl, tree, tmp_path):
    """Another command's run, a checkpointing.dir without the run's checkpoints (the run would start over in
    place), a policy with LoRA where the checkpoint has none: each one line at its key, exit 2, nothing changed."""
    out = tmp_path / "run"
    assert sft(rl, out, 1).code == 0
    before = tree(out)
    typo = tmp_path / "typo"
    lora = ("policy.lora.rank=4", "policy.lora.alpha=8", "policy.lora.target_modules=[q_proj,v_proj]")
    cases = [
        (("dpo", "--config", "dpo_tiny", f"output_dir={out}", "dpo.max_steps=2"), "dpo",
         f"checkpointing.resume: {out} holds an `rl sft` run, which `rl dpo` cannot continue"),
        ((*SFT, f"output_dir={out}", "sft.max_steps=2", f"checkpointing.dir={typo}"), "sft",
         f"checkpointing.dir: {typo} holds no checkpoint, but the run in {out} saved its checkpoints in "
         f"{out / 'checkpoints'}; resume with checkpointing.dir=null"),
        ((*SFT, f"output_dir={out}", "sft.max_steps=2", *lora), "sft",
         f"policy.lora: {out / 'checkpoints' / 'step_000001'} was trained without LoRA; resume with policy.lora=null"),
    ]
    for argv, command, message in cases:
        result = rl(*argv, "checkpointing.resume=true")
        assert result.code == 2, result.err
        [line] = result.error_lines(command)
        assert message in line and "Traceback" not in result.err
        assert tree(out) == before and not typo.exists()
