"""Loading configs that are right: defaults inheritance, deep merge, overrides, print-config round trip."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from rl_core.config import (
    ConfigError,
    config_to_dict,
    deep_merge,
    dump_config,
    load_config,
    load_yaml_with_defaults,
    parse_override,
)


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
ToyConfig = cases.ToyConfig


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_defaults_chain_later_files_and_the_file_itself_win(tmp_path):
    _write(
        tmp_path,
        {
            "base/model.yaml": "policy:\n  model: base-model\n  dtype: bfloat16\ntrain:\n  max_steps: 1\n  batch_size: 8\n",
            "base/long.yaml": "train:\n  max_steps: 100\n",
            "exp/run.yaml": "defaults: [../base/model.yaml, ../base/long.yaml]\ntrain:\n  batch_size: 2\n",
        },
    )
    cfg = load_config(ToyConfig, tmp_path / "exp/run.yaml", [])
    assert cfg.policy.model == "base-model"
    assert cfg.policy.dtype == "bfloat16"
    assert cfg.train.max_steps == 100  # long.yaml comes after model.yaml
    assert cfg.train.batch_size == 2  # the file itself comes last


def test_nested_defaults_are_relative_to_the_file_that_names_them(tmp_path):
    _write(
        tmp_path,
        {
            "a/b/root.yaml": "policy:\n  model: root\nseed: 1\n",
            "a/mid.yaml": "defaults: b/root.yaml\nseed: 2\n",
            "top.yaml": "defaults: a/mid.yaml\ntrain:\n  tags: [x]\n",
        },
    )
    cfg = load_config(ToyConfig, tmp_path / "top.yaml", [])
    assert (cfg.policy.model, cfg.seed, cfg.train.tags) == ("root", 2, ["x"])


def test_deep_merge_merges_mappings_and_replaces_lists():
    base = {"a": {"x": 1, "y": [1, 2, 3], "z": {"p": 1}}, "b": 1}
    override = {"a": {"y": [9], "z": {"q": 2}}, "c": None}
    merged = deep_merge(base, override)
    assert merged == {"a": {"x": 1, "y": [9], "z": {"p": 1, "q": 2}}, "b": 1, "c": None}
    assert base["a"]["y"] == [1, 2, 3]  # inputs are not modified


def test_a_mapping_replaced_by_a_scalar_and_back(tmp_path):
    _write(
        tmp_path,
        {"a.yaml": "x:\n  y: 1\n", "b.yaml": "defaults: a.yaml\nx: 3\n", "c.yaml": "defaults: b.yaml\nx:\n  z: 2\n"},
    )
    data, _ = load_yaml_with_defaults(tmp_path / "c.yaml")
    assert data == {"x": {"z": 2}}


def test_source_map_tracks_file_and_line_through_defaults(tmp_path):
    _write(
        tmp_path,
        {
            "base.yaml": "policy:\n  model: m\n  dtype: float32\ntrain:\n  tags: [a, b]\n",
            "run.yaml": "defaults: base.yaml\n\ntrain:\n  tags: [c]\n",
        },
    )
    data, sources = load_yaml_with_defaults(tmp_path / "run.yaml")
    assert "defaults" not in data
    assert sources.lookup(("policy", "dtype")).line == 3
    assert sources.lookup(("policy", "dtype")).file.endswith("base.yaml")
    assert sources.lookup(("train", "tags")).line == 4
    assert sources.lookup(("train", "tags")).file.endswith("run.yaml")
    assert sources.get(("train", "tags", 1)) is None  # base's second tag was replaced with the list
    assert sources.lookup(("policy", "nope")).line == 1  # unknown keys point at their section


def test_overrides_win_over_files_and_later_overrides_win(tmp_path):
    _write(tmp_path, {"run.yaml": "policy:\n  model: from-file\ntrain:\n  max_steps: 5\n"})
    cfg = load_config(
        ToyConfig,
        tmp_path / "run.yaml",
        ["train.max_steps=7", "policy.model=from-cli", "train.max_steps=9", "policy.optimizer.lr=3e-4"],
    )
    assert cfg.train.max_steps == 9
    assert cfg.policy.model == "from-cli"
    assert cfg.policy.optimizer.lr == pytest.approx(3e-4)
    assert isinstance(cfg.policy.optimizer.lr, float)


def test_override_values_are_yaml(tmp_path):
    cfg = load_config(
        ToyConfig,
        None,
        [
            "policy.model=m",
            "train.tags=[a, 'b c']",
            "train.env_kwargs={digits: 3, terms: 2}",
            "wandb_project=null",
            "output_dir=runs/x=1",  # only the first '=' separates key and value
            "policy.optimizer.betas=[0.8, 0.9]",
        ],
    )
    assert cfg.train.tags == ["a", "b c"]
    assert cfg.train.env_kwargs == {"digits": 3, "terms": 2}
    assert cfg.wandb_project is None
    assert cfg.output_dir == "runs/x=1"
    assert cfg.policy.optimizer.betas == (0.8, 0.9)


def test_override_can_fill_a_null_section_and_index_a_list(tmp_path):
    _write(tmp_path, {"run.yaml": "policy: null\ntrain:\n  tags: [a, b]\n"})
    cfg = load_config(ToyConfig, tmp_path / "run.yaml", ["policy.model=m", "train.tags.1=z"])
    assert cfg.policy.model == "m"
    assert cfg.train.tags == ["a", "z"]


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("a=1", ("a",), 1),
        ("a.b.c=1e-5", ("a", "b", "c"), 1e-5),
        ("a.b=-2.5", ("a", "b"), -2.5),
        ("a=true", ("a",), True),
        ("a=null", ("a",), None),
        ("a='5'", ("a",), "5"),
        ("a=", ("a",), ""),
        ("a.0.b=[1, 2]", ("a", 0, "b"), [1, 2]),
        ("my-key.sub_key={x: 1}", ("my-key", "sub_key"), {"x": 1}),
    ],
)
def test_parse_override(text, path, value):
    assert parse_override(text) == (path, value)


@pytest.mark.parametrize("text", ["a", "=1", "a..b=1", ".a=1", "a b=1", "a=[1"])
def test_parse_override_rejects(text):
    with pytest.raises(ValueError):
        parse_override(text)


def test_yaml_floats_in_exponent_form_are_floats(tmp_path):
    _write(tmp_path, {"run.yaml": "policy:\n  model: m\n  optimizer:\n    lr: 1e-5\n"})
    data, _ = load_yaml_with_defaults(tmp_path / "run.yaml")
    assert data["policy"]["optimizer"]["lr"] == 1e-5


def test_yaml_anchors_and_merge_keys_work(tmp_path):
    _write(
        tmp_path,
        {"run.yaml": "shared: &opt {name: sgd, lr: 0.5}\n"},
    )
    data, _ = load_yaml_with_defaults(tmp_path / "run.yaml")
    assert data == {"shared": {"name": "sgd", "lr": 0.5}}
    _write(tmp_path, {"m.yaml": "a: &x {p: 1, q: 2}\nb:\n  <<: *x\n  q: 3\n"})
    data, _ = load_yaml_with_defaults(tmp_path / "m.yaml")
    assert data["b"] == {"p": 1, "q": 3}


def test_empty_file_means_all_defaults(tmp_path):
    _write(tmp_path, {"empty.yaml": "# nothing here\n"})
    cfg = load_config(ToyConfig, tmp_path / "empty.yaml", ["policy.model=m"])
    assert cfg.train.max_steps == 10


def test_print_config_round_trip(tmp_path):
    _write(tmp_path, {"base.yaml": cases.BASE_YAML, "run.yaml": "defaults: base.yaml\ntrain:\n  tags: [a]\n"})
    cfg = load_config(ToyConfig, tmp_path / "run.yaml", ["policy.optimizer.lr=2e-6", "train.env_kwargs={k: 1}"])
    text = dump_config(cfg)
    assert yaml.safe_load(text) == config_to_dict(cfg)
    (tmp_path / "printed.yaml").write_text(text)
    again = load_config(ToyConfig, tmp_path / "printed.yaml", [])
    assert again == cfg
    assert dump_config(again) == text
    assert text.index("output_dir") < text.index("train") < text.index("policy")  # schema order, not sorted


def test_config_to_dict_is_plain():
    cfg = load_config(ToyConfig, None, ["policy.model=m"])
    plain = config_to_dict(cfg)
    assert plain["policy"]["optimizer"]["betas"] == [0.9, 0.999]  # tuples become lists
    assert plain["wandb_project"] is None


def test_validated_config_rejects_bad_assignment_too():
    cfg = load_config(ToyConfig, None, ["policy.model=m"])
    with pytest.raises(ValueError):
        cfg.train.max_steps = -1


def test_config_error_is_a_value_error_with_problems(tmp_path):
    with pytest.raises(ValueError) as info:
        load_config(ToyConfig, tmp_path / "missing.yaml", [])
    assert isinstance(info.value, ConfigError)
    assert info.value.problems[0].message == "file not found"
