"""`rl <command> --dry-run` on every command: the model and the data are checked, one templated sample is
printed with its loss mask and token counts, and nothing is written (no output directory, no file in the
working directory) and no Ray is started. Each command reads its data in another of the formats every
command reads (JSONL, JSON, parquet, `datasets` directories), in TRL's layouts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_apps import recipe_path
from rl_apps.cli import main

USER = {"role": "user", "content": "What is 2 + 3?"}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch, tmp_path):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))
    monkeypatch.chdir(tmp_path)


def tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def dry_run(tmp_path, capsys, command: str, recipe: str, *overrides: str) -> str:
    """Runs the dry run in ``tmp_path`` (the working directory) and checks it wrote nothing there."""
    import ray

    before = tree(tmp_path)
    code = main([command, "--config", recipe_path(recipe), "output_dir=run", *overrides, "--dry-run"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert tree(tmp_path) == before and not (tmp_path / "run").exists()
    assert not ray.is_initialized()
    assert captured.out.startswith(f"rl {command} --dry-run: checks the model and the data; writes nothing")
    assert captured.out.rstrip().endswith("nothing was written (run was not created)")
    return captured.out


@pytest.mark.parametrize(("command", "recipe", "shows"), [
    ("sft", "sft_tiny.yaml", "<|im_start|>assistant\n⟦The answer is "),
    ("dpo", "dpo_tiny.yaml", "training pair 1, rejected: "),
    ("rm", "rm_tiny.yaml", "training pair 1, chosen: "),
    ("distill", "distill_tiny.yaml", "tokens, against the teacher's top "),
    ("xtoken-distill", "xtoken_tiny.yaml", "vocabulary projection: 512 exact"),
    ("grpo", "grpo_smoke_tiny.yaml", "graded by env.name='reward_function'"),
])
def test_every_training_recipe_dry_runs_and_writes_nothing(tmp_path, capsys, command, recipe, shows):
    out = dry_run(tmp_path, capsys, command, recipe)
    assert "model     tiny-llama -> " in out or "student   tiny-llama -> " in out
    assert "chat template: yes" in out and shows in out


def test_every_command_has_a_dry_run():
    from rl_apps.commands import COMMANDS
    from rl_apps.dry_run import PREVIEWS

    assert set(PREVIEWS) == set(COMMANDS)


def test_eval_dry_run_renders_each_dataset(tmp_path, capsys):
    code = main(["eval", "--config", recipe_path("eval_tiny.yaml"), "report_path=report.json", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and not (tmp_path / "report.json").exists()
    assert "data      arithmetic-tiny: 8 items, graded by 'arithmetic'" in out and "<|im_start|>user\nWhat is " in out


def test_sft_from_parquet_marks_the_trained_tokens(tmp_path, capsys, write_rows):
    data = write_rows([{"prompt": "What is 2 + 3?", "completion": "It is 5."}] * 8, tmp_path, "parquet")
    out = dry_run(tmp_path, capsys, "sft", "sft_tiny.yaml", "synthetic_data=null", f"data.train_path={data}")
    assert f"train: 8 rows from {data}" in out and "validation: none" in out
    assert ("sample    training row 1: 27 tokens, 6 carry loss (between ⟦ ⟧)\n" + "-" * 72 + "\n"
            "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n⟦It is 5.<|im_end|>⟧\n") in out


def test_dpo_from_a_datasets_directory_with_implicit_prompts(tmp_path, capsys, write_rows):
    rows = [{"chosen": [USER, {"role": "assistant", "content": "It is 5."}],
             "rejected": [USER, {"role": "assistant", "content": "It is 7."}]}] * 8
    data = write_rows(rows, tmp_path, "datasets")
    out = dry_run(tmp_path, capsys, "dpo", "dpo_tiny.yaml", "synthetic_data=null", f"data.train_path={data}")
    assert "assistant\n⟦It is 5.<|im_end|>⟧" in out and "assistant\n⟦It is 7.<|im_end|>⟧" in out


def test_rm_from_json(tmp_path, capsys, write_rows):
    data = write_rows([{"prompt": "What is 2 + 3?", "chosen": "5", "rejected": "7"}] * 8, tmp_path, "json")
    out = dry_run(tmp_path, capsys, "rm", "rm_tiny.yaml", "synthetic_data=null", f"data.train_path={data}")
    assert "⟦5<|im_end|>⟧" in out and "⟦7<|im_end|>⟧" in out


def test_distill_and_xtoken_from_datasets_and_jsonl(tmp_path, capsys, write_rows):
    prompts = write_rows([{"prompt": [USER]}] * 8, tmp_path, "datasets")
    out = dry_run(tmp_path, capsys, "distill", "distill_tiny.yaml", "synthetic_data=null",
                  f"data.train_path={prompts}")
    assert "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n" + "-" * 72 in out
    texts = write_rows([{"text": "two plus three is five"}] * 8, tmp_path, "jsonl")
    out = dry_run(tmp_path, capsys, "xtoken-distill", "xtoken_tiny.yaml", "synthetic_data=null",
                  f"data.train_path={texts}")
    assert "t⟦wo plus three is five⟧" in out  # the tiny tokenizer is character-level: all but the first


def test_grpo_from_a_dataset_dict_directory(tmp_path, capsys):
    import datasets

    datasets.disable_progress_bars()
    saved = tmp_path / "saved"
    rows = [{"prompt": "What is 2 + 3?", "answer": 5}] * 4
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "validation": datasets.Dataset.from_list(rows[:2])}).save_to_disk(str(saved))
    out = dry_run(tmp_path, capsys, "grpo", "grpo_smoke_tiny.yaml", "data.kind=file", f"data.train_path={saved}",
                  f"data.validation_path={saved}")
    assert f"train: 4 rows from {saved}" in out and f"validation: 2 rows from {saved}" in out
    # No instruction is appended to the user's prompt.
    assert "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant" in out
    assert "metadata: {'answer': '5'}" in out


def test_a_bad_row_fails_the_dry_run_like_the_run(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "5"}\n')
    code = main(["sft", "--config", recipe_path("sft_tiny.yaml"), "output_dir=run", "synthetic_data=null",
                 f"data.train_path={data}", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "run").exists()
    assert f"{data}, line 1: missing field 'completion'" in err and "set data.response_key" in err
    assert "Traceback" not in err
