"""`rl grpo` on the user's own prompts: `data.kind=file` switches the section as an override, TRL's `prompt`
field (plain or conversational, `problem` still read), and nothing appended to the prompt unless configured."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from rl_apps import recipe_path
from rl_apps.cli import main
from rl_core.data_files import DataError
from rl_core.logging import read_jsonl_metrics
from rl_environments.config import FileDatasetConfig

QUIET = ["logger.progress_bar=false", "logger.tensorboard=false", "logger.plot=false", "checkpointing.enabled=false"]
ROWS = [
    {"prompt": "What is 2 + 3?", "answer": 5},                                       # TRL plain prompt
    {"prompt": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 4 + 4?"}], "answer": "8"},       # TRL conversational
    {"problem": "What is 1 + 6?", "answer": 7},                                      # the old field name
    {"prompt": "What is 9 + 1?", "answer": 10},
]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory):
    os.environ.setdefault("RL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "rl-cache"))


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_kind_file_override_replaces_the_recipes_arithmetic_section(prompts, capsys):
    """The default recipe's `data:` is arithmetic (digits, operators, sizes): one override switches it."""
    code = main(["grpo", "--print-config", "data.kind=file", f"data.train_path={prompts}",
                 f"data.validation_path={prompts}"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = yaml.safe_load(captured.out)["data"]
    assert data["kind"] == "file" and data["train_path"] == str(prompts)
    assert "digits" not in data and "operators" not in data and "train_size" not in data
    assert data["prompt_field"] == "prompt" and data["instruction"] is None


def test_a_key_of_another_kind_next_to_kind_is_still_an_error(tmp_path, prompts, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text(f"defaults: {recipe_path('grpo_smoke_tiny.yaml')}\n"
                      f"data: {{kind: file, train_path: {prompts}, digits: 3}}\n")
    assert main(["grpo", "--config", str(config), "grpo.val_every=0", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "mine.yaml:2: data.digits: unknown key 'digits'. 'digits' is a key of data with kind arithmetic" in err
    assert "Did you mean 'digits'" not in err
    # A misspelt key of the new kind still gets its did-you-mean.
    assert main(["grpo", "data.kind=file", f"data.train_pth={prompts}", "--print-config"]) == 2
    assert "Did you mean 'train_path'?" in capsys.readouterr().err


def test_prompt_field_plain_conversational_and_problem_alias_without_instruction(prompts):
    samples = FileDatasetConfig(train_path=str(prompts)).build("train")
    assert [s.messages for s in samples] == [
        [{"role": "user", "content": "What is 2 + 3?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 4 + 4?"}],
        [{"role": "user", "content": "What is 1 + 6?"}],
        [{"role": "user", "content": "What is 9 + 1?"}],
    ]
    assert [s.metadata["answer"] for s in samples] == ["5", "8", "7", "10"]
    worded = FileDatasetConfig(train_path=str(prompts), instruction="Box it.").build("train")
    assert worded[1].messages[-1]["content"] == "What is 4 + 4? Box it."


def test_missing_prompt_field_names_the_key_to_set(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "What is 2 + 3?", "answer": 5}\n')
    with pytest.raises(DataError, match=r"missing field 'prompt' .*'question'.*set prompt_field"):
        FileDatasetConfig(train_path=str(path)).build("train")


def test_grpo_trains_on_a_trl_prompt_file_with_one_override(tmp_path, prompts, capsys):
    out = tmp_path / "run"
    code = main(["grpo", "--config", recipe_path("grpo_smoke_tiny.yaml"), f"output_dir={out}", "data.kind=file",
                 f"data.train_path={prompts}", f"data.validation_path={prompts}", "grpo.max_steps=1",
                 "grpo.val_every=1", "grpo.val_num_prompts=2", *QUIET])
    assert code == 0, capsys.readouterr().err
    assert f"{prompts}: 4 rows used, 0 bad rows skipped" in capsys.readouterr().err
    records = read_jsonl_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records if "train/reward_mean" in r] == [1]
