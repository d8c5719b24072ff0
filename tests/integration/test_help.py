"""`rl <command> --help` is the command's own: its description, default recipe and other recipes, main keys
with defaults, and examples that run; `rl list recipes|envs|models`; `--print-config --comments`; a recipe
of another command is one line naming that command."""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path

import pytest
import yaml

from rl_apps import list_recipes
from rl_apps.cli import main
from rl_apps.commands import COMMANDS
from rl_apps.help import HELP
from rl_core.config import load_config


def test_every_command_has_help():
    assert set(HELP) == set(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_help_names_its_recipe_keys_and_examples(name, capsys):
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    module = importlib.import_module(COMMANDS[name].module)
    assert out.startswith(f"usage: rl {name} ") and f"rl {name}: {COMMANDS[name].summary}." in out
    assert f"default recipe: {Path(module.DEFAULT_RECIPE).name}" in out
    for key in HELP[name].main_keys:
        assert f"\n  {key} " in out, key
    examples = [line.strip() for line in out.split("examples:\n")[1].split("\n\n")[0].splitlines()]
    assert examples == [f"rl {name} {example}" for example in HELP[name].examples]
    others = [other for other in COMMANDS if other != name and f"rl {other} " in out]
    assert others == [], f"rl {name} --help shows examples of {others}"


def test_help_shows_class_defaults_and_the_recipes_values(capsys):
    module = importlib.import_module(COMMANDS["sft"].module)
    recipe = load_config(module.CONFIG_CLASS, module.DEFAULT_RECIPE)
    assert recipe.sft.max_steps != module.CONFIG_CLASS().sft.max_steps == 100
    assert main(["sft", "--help"]) == 0
    out = capsys.readouterr().out
    assert f"\n  sft.max_steps         100 (recipe: {recipe.sft.max_steps})\n      Training steps\n" in out
    assert f"\n  output_dir            runs/sft (recipe: {recipe.output_dir})\n      Metrics, the resolved" in out
    assert "\n  sft.batch_size        8\n" in out or recipe.sft.batch_size != 8
    assert "other recipes (--config NAME): sft_tiny_lora.yaml" in out


@pytest.mark.parametrize(("name", "example"), [(n, e) for n, h in HELP.items() for e in h.examples])
def test_every_help_example_is_a_valid_command_line(name, example, capsys):
    args = [arg for arg in shlex.split(example) if arg != "--dry-run"]
    assert main([name, *args, "--print-config"]) == 0, capsys.readouterr().err


def test_list_recipes_gives_each_recipe_its_command(capsys):
    assert main(["list", "recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1] for line in lines if line.split()[:1] and line.split()[0].endswith(".yaml")}
    assert set(rows) == set(list_recipes())
    assert rows["sft_tiny.yaml"] == "sft" and rows["dapo.yaml"] == "grpo" and rows["eval_tiny.yaml"] == "eval"
    assert rows["xtoken_tiny.yaml"] == "xtoken-distill"


def test_list_envs_and_models(capsys):
    from rl_core.models.resolve import SHORT_NAMES
    from rl_environments.registry import list_environments

    assert main(["list", "envs"]) == 0
    envs = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:] if line.strip()]
    assert set(list_environments()) <= set(envs)
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{name} " in out for name in SHORT_NAMES) and "HuggingFaceTB/SmolLM2-135M-Instruct" in out
    assert main(["list", "nothing"]) == 2
    assert "invalid choice: 'nothing'" in capsys.readouterr().err


def test_a_recipe_of_another_command_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sft", "--config", "grpo"]) == 2
    err = capsys.readouterr().err
    assert err == ("rl sft: --config grpo: grpo.yaml is a recipe of `rl grpo`, not of `rl sft`; run "
                   "`rl grpo --config grpo`, or pick a recipe of rl sft: sft_tiny.yaml, sft_tiny_lora.yaml, sft_vlm_shapes.yaml "
                   "(rl list recipes)\n")
    assert list(tmp_path.iterdir()) == []


def test_print_config_comments_documents_every_key_and_loads_back(tmp_path, capsys):
    assert main(["sft", "--print-config", "--comments", "sft.max_steps=7"]) == 0
    out = capsys.readouterr().out
    assert "# Seeds the driver, the workers, the data order and every generation call (0 to 2**32 - 1).\nseed: 0\n" in out
    assert "# Metrics, the resolved ``config.yaml``" in out  # output_dir's text, inherited from RunConfig
    assert "\n    # Peak learning rate of AdamW" in out and "\n    lr: " in out
    printed = tmp_path / "printed.yaml"
    printed.write_text(out)
    module = importlib.import_module(COMMANDS["sft"].module)
    assert load_config(module.CONFIG_CLASS, printed) == load_config(module.CONFIG_CLASS, module.DEFAULT_RECIPE,
                                                                     ["sft.max_steps=7"])
    assert yaml.safe_load(out)["sft"]["max_steps"] == 7


def test_keys_of_another_command_say_whose_they_are(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sft", "grpo.max_steps=5", "teacher.model=x", "sft.max_stepz=1"]) == 2
    err = capsys.readouterr().err
    assert ("grpo: unknown key 'grpo': it is a key of rl grpo, not of rl sft (`rl sft --help` lists this command's "
            "keys)") in err
    assert "teacher: unknown key 'teacher': it is a key of rl distill, rl xtoken-distill, not of rl sft" in err
    assert "sft.max_stepz: unknown key 'max_stepz'. Did you mean 'max_steps'?" in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []


def test_comments_without_print_config_runs_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sft", "--comments"]) == 2
    assert capsys.readouterr().err == "rl sft: --comments goes with --print-config (rl sft --print-config --comments)\n"
    assert list(tmp_path.iterdir()) == []
