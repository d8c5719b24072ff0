"""A later layer that changes a tagged section's `kind` starts that section afresh; a plain `kind` setting
keeps its section; a key of the other kind set next to the new `kind` is an error whose hint names the kind."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field

from rl_core.config import ConfigError, StrictModel, load_config


class Procedural(StrictModel):
    kind: Literal["procedural"] = "procedural"
    digits: int = 2
    instruction: str | None = None


class FromFile(StrictModel):
    kind: Literal["file"] = "file"
    path: str | None = None
    instruction: str | None = None


class Schedule(StrictModel):
    kind: Literal["constant", "cosine"] = "constant"
    warmup: int = 0


class Run(StrictModel):
    data: Annotated[Procedural | FromFile, Field(discriminator="kind")] = Field(default_factory=Procedural)
    sets: list[Annotated[Procedural | FromFile, Field(discriminator="kind")]] = Field(default_factory=list)
    schedule: Schedule = Field(default_factory=Schedule)


RECIPE = """data: {kind: procedural, digits: 3, instruction: Add.}
sets:
  - {kind: procedural, digits: 4}
schedule: {kind: constant, warmup: 5}
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    return path


def test_an_override_of_kind_drops_the_old_kinds_keys(recipe):
    cfg = load_config(Run, recipe, ["data.kind=file", "data.path=x.jsonl", "sets.0.kind=file"])
    assert cfg.data == FromFile(path="x.jsonl")  # the procedural instruction is not carried over
    assert cfg.sets == [FromFile()]
    # Overrides before and after the switch are both kept.
    cfg = load_config(Run, recipe, ["data.instruction=Box it.", "data.kind=file"])
    assert cfg.data == FromFile(instruction="Box it.")


def test_the_same_kind_again_merges_as_usual(recipe):
    assert load_config(Run, recipe, ["data.kind=procedural"]).data == Procedural(digits=3, instruction="Add.")


def test_a_plain_kind_setting_keeps_its_section(recipe):
    assert load_config(Run, recipe, ["schedule.kind=cosine"]).schedule == Schedule(kind="cosine", warmup=5)


def test_a_file_over_its_defaults_switches_too(tmp_path, recipe):
    child = tmp_path / "child.yaml"
    child.write_text("defaults: recipe.yaml\ndata: {kind: file, path: y.jsonl}\nschedule: {kind: cosine}\n")
    cfg = load_config(Run, child, [])
    assert cfg.data == FromFile(path="y.jsonl") and cfg.schedule == Schedule(kind="cosine", warmup=5)


def test_a_key_of_another_kind_next_to_the_new_kind_is_an_error(tmp_path, recipe):
    child = tmp_path / "child.yaml"
    child.write_text("defaults: recipe.yaml\ndata: {kind: file, digits: 5}\n")
    with pytest.raises(ConfigError) as err:
        load_config(Run, child, [])
    message = str(err.value)
    assert "child.yaml:2: data.digits: unknown key 'digits'. 'digits' is a key of data with kind procedural." in message
    assert "Did you mean" not in message
    with pytest.raises(ConfigError, match=r"data.digits: unknown key 'digits'.*kind procedural"):
        load_config(Run, recipe, ["data.kind=file", "data.digits=4"])
