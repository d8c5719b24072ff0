"""Every bad config gives one clear problem: where (file:line or override), the key, and a fix."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from pydantic import Field, model_validator

from rl_core.config import ConfigError, StrictModel, load_config


def _load_cases():
    """Import config_cases.py by path (tests run with --import-mode=importlib)."""
    name = "rl_core_config_cases"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("config_cases.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


cases = _load_cases()


@pytest.mark.parametrize("case", cases.BAD_CASES, ids=lambda c: c.name)
def test_bad_config_gives_one_clear_problem(case, tmp_path):
    config_path = cases.write_case(case, tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(cases.ToyConfig, config_path, case.overrides)
    error = info.value
    assert len(error.problems) == 1, str(error)
    message = str(error)
    for expected in case.expect:
        assert expected in message, f"{expected!r} not in:\n{message}"
    assert isinstance(error, ValueError)


def test_at_least_fifteen_distinct_bad_configs():
    assert len({case.name for case in cases.BAD_CASES}) >= 15


def test_all_problems_are_reported_at_once(tmp_path):
    (tmp_path / "many.yaml").write_text(
        "policy:\n"
        "  modle: x\n"  # unknown key (and so model is missing)
        "train:\n"
        "  max_steps: 0\n"  # gt=0
        "  batch_size: lots\n"  # wrong type
    )
    with pytest.raises(ConfigError) as info:
        load_config(cases.ToyConfig, tmp_path / "many.yaml", ["seed=abc", "nokey"])
    problems = {p.key: p for p in info.value.problems}
    assert set(problems) == {"", "policy.modle", "policy.model", "train.max_steps", "train.batch_size", "seed"}
    assert problems["policy.modle"].where.endswith("many.yaml:2")
    assert problems["policy.model"].where.endswith("many.yaml:1")  # the section that lacks it
    assert problems["train.max_steps"].where.endswith("many.yaml:4")
    assert problems["train.batch_size"].where.endswith("many.yaml:5")
    assert problems["seed"].where == "command-line override 'seed=abc'"
    assert problems[""].where == "command-line override 'nokey'"
    assert str(info.value).startswith("Invalid config (6 problems):")


def test_union_errors_are_merged_into_one_problem(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(cases.ToyConfig, None, ["policy.model=m", "wandb_project=[1, 2]"])
    (problem,) = info.value.problems
    assert problem.key == "wandb_project"
    assert "got a list [1, 2]" in problem.message


def test_no_config_file_and_missing_required_key():
    with pytest.raises(ConfigError) as info:
        load_config(cases.ToyConfig, None, [])
    (problem,) = info.value.problems
    assert problem.key == "policy"
    assert "required key is missing (expected a section (Policy))" in problem.message
    assert problem.where == "<no config file>"


def test_unknown_key_lists_valid_keys_when_nothing_is_close(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(cases.ToyConfig, None, ["policy.model=m", "train.zzz=1"])
    message = str(info.value)
    assert "unknown key 'zzz'" in message
    assert "Valid keys here: batch_size, env_kwargs, max_steps, tags" in message


class _Schedule(StrictModel):
    warmup_steps: int = 0
    max_steps: int = 10

    @model_validator(mode="after")
    def _warmup_fits(self):
        if self.warmup_steps > self.max_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must not exceed max_steps ({self.max_steps})")
        return self


class _WithSchedule(StrictModel):
    schedule: _Schedule = Field(default_factory=_Schedule)


def test_rules_across_fields_are_reported_at_their_section(tmp_path):
    (tmp_path / "run.yaml").write_text("# a schedule\nschedule:\n  warmup_steps: 20\n")
    with pytest.raises(ConfigError) as info:
        load_config(_WithSchedule, tmp_path / "run.yaml", [])
    (problem,) = info.value.problems
    assert problem.where.endswith("run.yaml:2")
    assert problem.key == "schedule"
    assert problem.message == "warmup_steps (20) must not exceed max_steps (10)."
