"""The `rl` command: bad configs exit 2 and write nothing; good ones run; help, version, print-config."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

import rl_apps
from rl_apps import cli
from rl_apps.commands import COMMANDS, CommandSpec
from rl_core.config import ConfigError, ConfigProblem, load_config


def _load_cases():
    """tests/rl_core/config_cases.py, imported by path (tests run with --import-mode=importlib)."""
    name = "rl_core_config_cases"
    if name not in sys.modules:
        path = Path(__file__).parents[1] / "rl_core" / "config_cases.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


cases = _load_cases()


def _toy_run(cfg) -> int:
    """A real (tiny) command: it creates its output directory and writes a log, like every run does."""
    if cfg.policy.model == "no-such-model":  # a check the schema cannot make, done before writing anything
        raise ConfigError(ConfigProblem("<config>", "policy.model", "no model of that name"))
    out = Path(cfg.output_dir)
    out.mkdir(parents=True)
    (out / "log.txt").write_text(f"steps={cfg.train.max_steps} model={cfg.policy.model}\n")
    return 0


@pytest.fixture
def toy_command(monkeypatch, tmp_path):
    """Registers `rl toy` (schema: config_cases.ToyConfig) and runs the test inside tmp_path."""
    module = types.ModuleType("rl_test_toy_command")
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    module.CONFIG_CLASS = cases.ToyConfig
    module.DEFAULT_RECIPE = None
    module.run = _toy_run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(COMMANDS, "toy", CommandSpec("toy", module.__name__, "a toy command for tests"))
    monkeypatch.chdir(tmp_path)
    return module


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.parametrize("case", cases.BAD_CASES, ids=lambda c: c.name)
def test_bad_config_exits_2_and_writes_nothing(case, toy_command, tmp_path, capsys):
    config_path = cases.write_case(case, tmp_path)
    before = _tree(tmp_path)
    code = cli.main(["toy", "--config", str(config_path), *case.overrides])
    err = capsys.readouterr().err
    assert code == 2
    for expected in case.expect:
        assert expected in err, f"{expected!r} not in:\n{err}"
    assert _tree(tmp_path) == before
    assert not (tmp_path / "outputs").exists()


def test_good_config_runs_and_writes_its_output(toy_command, tmp_path):
    (tmp_path / "base.yaml").write_text(cases.BASE_YAML)
    assert cli.main(["toy", "train.max_steps=4", "--config", "base.yaml", "output_dir=out/run1"]) == 0
    assert (tmp_path / "out/run1/log.txt").read_text() == "steps=4 model=tiny-llama\n"


def test_config_error_raised_by_run_exits_2(toy_command, tmp_path, capsys):
    assert cli.main(["toy", "policy.model=no-such-model"]) == 2
    assert "policy.model: no model of that name" in capsys.readouterr().err
    assert not (tmp_path / "outputs").exists()


def test_print_config_prints_resolved_yaml_and_runs_nothing(toy_command, tmp_path, capsys):
    (tmp_path / "base.yaml").write_text(cases.BASE_YAML)
    assert cli.main(["toy", "--config", "base.yaml", "--print-config", "policy.optimizer.lr=2e-4"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# resolved config of: rl toy --config base.yaml --print-config")
    data = yaml.safe_load(printed)
    assert data["policy"]["optimizer"]["lr"] == 2e-4
    assert data["train"]["max_steps"] == 3
    assert not (tmp_path / "outputs").exists()
    (tmp_path / "printed.yaml").write_text(printed)
    assert load_config(cases.ToyConfig, tmp_path / "printed.yaml", []) == load_config(
        cases.ToyConfig, tmp_path / "base.yaml", ["policy.optimizer.lr=2e-4"]
    )


def test_several_problems_are_all_printed(toy_command, tmp_path, capsys):
    (tmp_path / "base.yaml").write_text(cases.BASE_YAML)
    code = cli.main(["toy", "--config", "base.yaml", "train.max_stepz=1", "seed=x", "policy.dtype=fp8"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Invalid config (3 problems)" in err
    assert "Did you mean 'max_steps'?" in err and "seed" in err and "'float32' or 'bfloat16'" in err


def test_config_may_name_a_packaged_recipe(toy_command, tmp_path, monkeypatch, capsys):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "toy_recipe.yaml").write_text(cases.BASE_YAML)
    monkeypatch.setattr(rl_apps, "RECIPES_DIR", recipes)
    assert cli.main(["toy", "--config", "toy_recipe", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["policy"]["model"] == "tiny-llama"
    assert cli.main(["toy", "--config", "no_such_recipe"]) == 2
    assert "packaged recipes: toy_recipe.yaml" in capsys.readouterr().err


def test_default_recipe_is_used_without_config(toy_command, tmp_path, capsys):
    (tmp_path / "default.yaml").write_text(cases.BASE_YAML)
    toy_command.DEFAULT_RECIPE = str(tmp_path / "default.yaml")
    assert cli.main(["toy", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["train"]["max_steps"] == 3


def test_unknown_option_is_a_usage_error(toy_command, capsys):
    assert cli.main(["toy", "--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_registered_command_is_written_and_its_default_recipe_loads(name, capsys):
    module = importlib.import_module(COMMANDS[name].module)
    assert all(hasattr(module, attribute) for attribute in ("CONFIG_CLASS", "DEFAULT_RECIPE", "run"))
    assert cli.main([name, "--print-config"]) == 0, capsys.readouterr().err
    assert yaml.safe_load(capsys.readouterr().out)


def test_version_and_help_in_process(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rl {rl_apps.__version__}"
    assert cli.main(["grpo", "--help"]) == 0
    assert "--print-config" in capsys.readouterr().out
    assert cli.main([]) == 2
    assert cli.main(["no-such-command"]) == 2


def test_rl_help_as_a_subprocess():
    rl = Path(sys.executable).with_name("rl")
    command = [str(rl)] if rl.exists() else [sys.executable, "-m", "rl_apps.cli"]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    for name in COMMANDS:
        assert name in result.stdout
