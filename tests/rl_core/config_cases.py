"""A small schema and a table of bad configs, shared by tests/rl_core and tests/integration/test_cli.py.

Not a test file: the tests import it by path (they run with --import-mode=importlib).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from rl_core.config import StrictModel


class Optimizer(StrictModel):
    name: Literal["adamw", "sgd"] = "adamw"
    """Optimizer algorithm."""
    lr: float = Field(1e-5, gt=0)
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)


class Policy(StrictModel):
    model: str
    """Model name or local HF directory."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    optimizer: Optimizer = Field(default_factory=Optimizer)


class Train(StrictModel):
    max_steps: int = Field(10, gt=0)
    """Optimizer steps to run."""
    batch_size: int = Field(4, gt=0)
    tags: list[str] = []
    env_kwargs: dict[str, int] = {}


class ToyConfig(StrictModel):
    output_dir: str = "outputs/toy"
    """Where the run writes its log."""
    seed: int = 0
    train: Train = Field(default_factory=Train)
    policy: Policy
    wandb_project: str | None = None


BASE_YAML = """\
policy:
  model: tiny-llama
train:
  max_steps: 3
"""


@dataclass
class BadCase:
    """A config that must fail with exactly one problem whose text contains every ``expect`` string."""

    name: str
    main: str
    """Text of toy.yaml (the file passed as --config); may use ``defaults: base.yaml``."""
    overrides: list[str] = field(default_factory=list)
    expect: list[str] = field(default_factory=list)
    extra_files: dict[str, str] = field(default_factory=dict)
    config_name: str = "toy.yaml"
    """The path passed as --config (relative to the folder holding the files)."""


BAD_CASES = [
    BadCase(
        "unknown_top_level_key",
        "defaults: base.yaml\ntrian:\n  max_steps: 5\n",
        expect=["toy.yaml:2", "trian", "unknown key", "Did you mean 'train'?"],
    ),
    BadCase(
        "misspelled_nested_key",
        "defaults: base.yaml\ntrain:\n  max_stesp: 5\n",
        expect=["toy.yaml:3", "train.max_stesp", "Did you mean 'max_steps'?"],
    ),
    BadCase(
        "misspelled_deep_key",
        "defaults: base.yaml\npolicy:\n  optimizer:\n    lrr: 0.1\n",
        expect=["toy.yaml:4", "policy.optimizer.lrr", "Did you mean 'lr'?"],
    ),
    BadCase(
        "key_in_the_wrong_section",
        "defaults: base.yaml\npolicy:\n  lr: 0.1\n",
        expect=["toy.yaml:3", "policy.lr", "unknown key 'lr'", "'lr' is a key of: policy.optimizer."],
    ),
    BadCase(
        "wrong_type",
        "defaults: base.yaml\ntrain:\n  max_steps: ten\n",
        expect=["toy.yaml:3", "train.max_steps", "got 'ten'", "valid integer"],
    ),
    BadCase(
        "bad_enum_value",
        "defaults: base.yaml\npolicy:\n  optimizer:\n    name: adam\n",
        expect=["toy.yaml:4", "policy.optimizer.name", "'adamw' or 'sgd'", "Did you mean 'adamw'?"],
    ),
    BadCase(
        "missing_required_key",
        "policy:\n  dtype: float32\n",
        expect=["toy.yaml:1", "policy.model", "required key is missing", "Model name or local HF directory"],
    ),
    BadCase(
        "bad_override_syntax",
        "defaults: base.yaml\n",
        overrides=["train.max_steps"],
        expect=["command-line override 'train.max_steps'", "no '=' found", "key.subkey=value"],
    ),
    BadCase(
        "override_of_unknown_key",
        "defaults: base.yaml\n",
        overrides=["train.max_step=5"],
        expect=["command-line override 'train.max_step=5'", "train.max_step", "Did you mean 'max_steps'?"],
    ),
    BadCase(
        "override_of_unknown_section",
        "defaults: base.yaml\n",
        overrides=["trainer.lr=0.1"],
        expect=["command-line override 'trainer.lr=0.1'", "unknown key 'trainer'", "Did you mean 'train'?"],
    ),
    BadCase(
        "override_with_bad_value",
        "defaults: base.yaml\n",
        overrides=["policy.optimizer.lr=-1"],
        expect=["command-line override 'policy.optimizer.lr=-1'", "got -1", "greater than 0"],
    ),
    BadCase(
        "override_unreadable_yaml_value",
        "defaults: base.yaml\n",
        overrides=["train.tags=[a, b"],
        expect=["command-line override 'train.tags=[a, b'", "cannot read the value", "quote it"],
    ),
    BadCase(
        "override_below_a_scalar",
        "defaults: base.yaml\n",
        overrides=["train.max_steps.value=3"],
        expect=["train.max_steps.value", "'train.max_steps' holds 3, not a section"],
    ),
    BadCase(
        "yaml_syntax_error",
        "defaults: base.yaml\ntrain:\n  max_steps: 5\n  tags: [a, b\n  batch_size: 2\n",
        expect=["toy.yaml:5", "YAML syntax error"],
    ),
    BadCase(
        "yaml_tab_indentation",
        "defaults: base.yaml\ntrain:\n\tmax_steps: 5\n",
        expect=["toy.yaml:3", "YAML syntax error"],
    ),
    BadCase("missing_file", "", config_name="nope.yaml", expect=["nope.yaml", "file not found"]),
    BadCase(
        "missing_defaults_file",
        "defaults: basee.yaml\n",
        expect=["toy.yaml:1", "defaults", "'basee.yaml' not found"],
    ),
    BadCase(
        "circular_defaults",
        "defaults: loop.yaml\n",
        extra_files={"loop.yaml": "defaults: [base.yaml, toy.yaml]\n"},
        expect=["loop.yaml:1", "circular defaults", "toy.yaml -> loop.yaml -> toy.yaml"],
    ),
    BadCase(
        "defaults_of_wrong_type",
        "defaults: {file: base.yaml}\n",
        expect=["toy.yaml:1", "defaults", "expected a file path or a list of file paths"],
    ),
    BadCase(
        "negative_size",
        "defaults: base.yaml\ntrain:\n  batch_size: -4\n",
        expect=["toy.yaml:3", "train.batch_size", "got -4", "greater than 0"],
    ),
    BadCase(
        "list_where_mapping_expected",
        "defaults: base.yaml\ntrain: [1, 2]\n",
        expect=["toy.yaml:2", "train", "a list [1, 2]", "expected a mapping"],
    ),
    BadCase(
        "top_level_not_a_mapping",
        "- policy\n- train\n",
        expect=["toy.yaml", "top level of a config file must be a mapping", "got a list"],
    ),
    BadCase(
        "duplicate_key",
        "defaults: base.yaml\ntrain:\n  max_steps: 5\n  batch_size: 2\n  max_steps: 6\n",
        expect=["toy.yaml:5", "train.max_steps", "duplicate key (first set on line 3)"],
    ),
    BadCase(
        "null_for_non_optional",
        "defaults: base.yaml\ntrain:\n  max_steps: null\n",
        expect=["toy.yaml:3", "train.max_steps", "got null", "valid integer"],
    ),
    BadCase(
        "bad_value_inside_dict",
        "defaults: base.yaml\ntrain:\n  env_kwargs:\n    digits: two\n",
        expect=["toy.yaml:4", "train.env_kwargs.digits", "got 'two'"],
    ),
    BadCase(
        "bad_item_in_list",
        "defaults: base.yaml\ntrain:\n  tags:\n    - ok\n    - [nested]\n",
        expect=["toy.yaml:5", "train.tags.1", "valid string"],
    ),
    BadCase(
        "tuple_of_wrong_length",
        "defaults: base.yaml\npolicy:\n  optimizer:\n    betas: [0.9]\n",
        expect=["toy.yaml:4", "policy.optimizer.betas", "item 1 is missing; expected tuple[float, float]"],
    ),
    BadCase(
        "unknown_key_inside_defaults_file",
        "defaults: parent.yaml\n",
        extra_files={"parent.yaml": "defaults: base.yaml\npolicy:\n  modle: x\n"},
        expect=["parent.yaml:3", "policy.modle", "Did you mean 'model'?"],
    ),
]


def write_case(case: BadCase, folder: Path) -> Path:
    """Write the case's files into ``folder``; return the --config path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(BASE_YAML)
    if case.main:
        (folder / "toy.yaml").write_text(case.main)
    for name, text in case.extra_files.items():
        (folder / name).write_text(text)
    return folder / case.config_name
