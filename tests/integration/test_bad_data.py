"""A bad data file on any command: exit 2, one line naming the file and row, nothing written; with
`on_bad_row: skip` the bad rows are counted and reported and the run goes on."""

from __future__ import annotations

import os

import pytest

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_core.logging import read_jsonl_metrics

GOOD = b'{"problem": "What is 2 + 3?", "answer": 5}'
QUIET = ["logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false", "checkpointing.enabled=false"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))


def grpo(tmp_path, data: str, *extra: str) -> int:
    return main(["grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 f"data={data}", "grpo.max_steps=1", *QUIET, *extra])


@pytest.mark.parametrize(("line", "says"), [
    (b'{"problem": "What is 1 + 1?"}', "line 2: missing field 'answer'"),
    (b'{"problem": "What is 1 + 1?", "answer": ', "line 2: invalid JSON"),
    (b'{"problem": "caf\xe9", "answer": 1}', "line 2: not valid UTF-8"),
    (b'{"problem": ["What is", "1 + 1?"], "answer": 2}', "line 2: 'problem' must be a list of {role, content}"),
    (b'{"problem": "What is 1 + 1?", "answer": null}', "line 2: field 'answer' must be a string or a number"),
    (b'{"problem": "' + b"1 + " * 200 + b'1", "answer": 201}', "line 2: the prompt is"),
])
def test_grpo_bad_training_row_exits_2_naming_file_and_row(tmp_path, capsys, line, says):
    train = tmp_path / "train.jsonl"
    train.write_bytes(GOOD + b"\n" + line + b"\n")
    assert grpo(tmp_path, f"{{kind: file, train_path: {train}}}", "grpo.val_every=0") == 2
    err = capsys.readouterr().err
    assert f"{train}, {says}" in err and "data.on_bad_row=skip" in err
    assert "Traceback" not in err and [ln for ln in err.splitlines() if ln.startswith("rl grpo: ")] == [
        err.splitlines()[-1]]
    assert not (tmp_path / "run").exists()


def test_grpo_prompt_over_the_token_budget_names_the_key(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    train.write_bytes(GOOD + b"\n" + b'{"problem": "' + b"1 + " * 200 + b'1", "answer": 201}\n')
    assert grpo(tmp_path, f"{{kind: file, train_path: {train}}}", "grpo.val_every=0") == 2
    assert "leaves no room to generate under grpo.max_total_length=96" in capsys.readouterr().err


def test_grpo_prompt_over_the_engines_context_names_generation_max_seq_len(tmp_path, capsys):
    """generation.max_seq_len below grpo.max_total_length is the engine's context: a prompt that fills it is a
    bad row at load (one line, nothing written), not an engine error mid-run."""
    train = tmp_path / "train.jsonl"
    train.write_bytes(GOOD + b"\n")
    assert grpo(tmp_path, f"{{kind: file, train_path: {train}}}", "grpo.val_every=0", "generation.max_seq_len=20") == 2
    err = capsys.readouterr().err
    assert f"{train}, line 1: the prompt is" in err and "under generation.max_seq_len=20" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_grpo_empty_file_bad_validation_file_and_missing_split(tmp_path, capsys):
    empty, train, val = tmp_path / "empty.jsonl", tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    empty.write_bytes(b"")
    train.write_bytes(GOOD + b"\n")
    val.write_bytes(GOOD + b"\n" + b"not json\n")
    assert grpo(tmp_path, f"{{kind: file, train_path: {empty}}}", "grpo.val_every=0") == 2
    assert f"{empty}: the dataset is empty" in capsys.readouterr().err
    assert grpo(tmp_path, f"{{kind: file, train_path: {train}, validation_path: {val}}}") == 2
    assert f"{val}, line 2: invalid JSON" in capsys.readouterr().err
    # grpo.val_every > 0 without a validation file: a config error before anything starts.
    assert grpo(tmp_path, f"{{kind: file, train_path: {train}}}") == 2
    assert "set data.validation_path" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_grpo_skips_and_reports_bad_rows(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    bad = b'{"problem": "What is 1 + 1?", "answer": null}'
    train.write_bytes(b"\n".join([GOOD, bad, GOOD.replace(b"2 + 3", b"4 + 4").replace(b"5", b"8"), b"[]"]) + b"\n")
    data = f"{{kind: file, train_path: {train}, validation_path: {train}, on_bad_row: skip}}"
    assert grpo(tmp_path, data, "grpo.val_every=1", "grpo.val_num_prompts=2") == 0
    err = capsys.readouterr().err
    assert f"{train}: 2 rows used, 2 bad rows skipped" in err
    assert f"skipped {train}, line 2: field 'answer'" in err and f"skipped {train}, line 4: expected a JSON object" in err
    records = read_jsonl_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records if "train/reward_mean" in r] == [1]
    assert [r["step"] for r in records if "val/accuracy" in r] == [0, 1]


@pytest.mark.parametrize(("command", "recipe", "row"), [
    ("dpo", "dpo_tiny.yaml", b'{"prompt": "2 + 2?", "chosen": "4"}'),
    ("rm", "rm_tiny.yaml", b'{"prompt": "2 + 2?", "chosen": "4", "rejected": null}'),
    ("distill", "distill_tiny.yaml", b'{"prompt": 4}'),
    ("xtoken-distill", "xtoken_tiny.yaml", b'{"txt": "hello"}'),
])
def test_supervised_commands_exit_2_on_a_bad_row(tmp_path, capsys, command, recipe, row):
    good = {"dpo": b'{"prompt": "1 + 1?", "chosen": "2", "rejected": "3"}', "distill": b'{"prompt": "1 + 1?"}',
            "xtoken-distill": b'{"text": "1 + 1 = 2"}'}
    data = tmp_path / "train.jsonl"
    data.write_bytes(good.get(command, good["dpo"]) + b"\n" + row + b"\n")
    code = main([command, "--config", recipe_path(recipe), f"output_dir={tmp_path / 'run'}", "synthetic_data=null",
                 f"data.train_path={data}"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{data}, line 2: " in err and "data.on_bad_row=skip" in err
    assert not (tmp_path / "run").exists()


def test_a_batch_larger_than_the_data_is_a_config_error(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b'{"prompt": "1 + 1?", "response": "2"}\n' * 3)
    code = main(["sft", "--config", recipe_path("sft_tiny.yaml"), f"output_dir={tmp_path / 'run'}",
                 "synthetic_data=null", f"data.train_path={data}", "sft.batch_size=4"])
    assert code == 2
    assert "sft.batch_size: 4 items per step, but the training data holds only 3 usable rows" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _unreadable_data(tmp_path, kind: str) -> str:
    """A parquet file cut in half, or a save_to_disk directory whose .arrow file was cut to 100 bytes."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": "1 + 1?", "completion": "2", "problem": "What is 1 + 1?", "answer": 2}] * 4
    if kind == "parquet":
        path = tmp_path / "trunc.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return str(path)
    datasets.disable_progress_bars()
    path = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    [arrow] = path.glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[:100])
    return str(path)


@pytest.mark.parametrize("kind", ["parquet", "datasets"])
@pytest.mark.parametrize("command", ["sft", "sft --dry-run", "grpo", "eval"])
def test_an_unreadable_parquet_file_or_saved_dataset_exits_2_naming_it(tmp_path, capsys, kind, command):
    path = _unreadable_data(tmp_path, kind)
    run = tmp_path / "run"
    if command.startswith("sft"):
        args = ["sft", "--config", recipe_path("sft_tiny.yaml"), f"output_dir={run}", "synthetic_data=null",
                f"data.train_path={path}", "sft.batch_size=1", "sft.max_steps=1", *command.split()[1:]]
    elif command == "grpo":
        args = ["grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"), f"output_dir={run}", "data.kind=file",
                f"data.train_path={path}", "grpo.val_every=0", "grpo.max_steps=1", *QUIET]
    else:
        args = ["eval", "--config", recipe_path("eval_tiny.yaml"), f"report_path={run / 'report.json'}",
                f"datasets=[{{name: x, data: {{kind: file, path: {path}}}}}]"]
    assert main(args) == 2
    err = capsys.readouterr().err
    what = "parquet file" if kind == "parquet" else "datasets save_to_disk directory"
    [line] = [ln for ln in err.splitlines() if f"{path}: not a readable {what} (" in ln]
    assert line == err.strip().splitlines()[-1] and ("write it again" in line or "save the dataset again" in line)
    assert "Traceback" not in err and not run.exists()
