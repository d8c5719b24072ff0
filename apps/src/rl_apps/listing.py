"""``rl list recipes | envs | models``: the packaged recipes with the command that runs each, the registered
environments, and the model names that resolve offline."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from functools import cache

from rl_apps import list_recipes, recipe_path
from rl_apps.commands import COMMANDS


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rl list", description="List what a config may name.")
    parser.add_argument("what", choices=list(LISTS), help="recipes (with their command), envs, or models")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    for line in LISTS[args.what]():
        print(line)
    return 0


@cache
def recipe_commands(recipe: str) -> tuple[str, ...]:
    """The commands whose config the packaged ``recipe`` is (it validates against their config class)."""
    from rl_core.config import ConfigError, load_config

    found = []
    for name, spec in COMMANDS.items():
        try:
            load_config(importlib.import_module(spec.module).CONFIG_CLASS, recipe_path(recipe))
        except ConfigError:
            continue
        found.append(name)
    return tuple(found)


def keys_of_other_commands(command: str, error: Exception) -> Exception:
    """``error`` (a ConfigError), with each unknown top-level key that is a section of other commands
    (``rl sft grpo.max_steps=5``) saying which; other errors as they are."""
    from rl_core.config import ConfigError, ConfigProblem

    problems = getattr(error, "problems", None)
    if not isinstance(error, ConfigError) or not problems:
        return error
    fixed = []
    for problem in problems:
        owners = []
        if "." not in problem.key and problem.message.startswith(f"unknown key '{problem.key}'"):
            owners = [f"rl {name}" for name, spec in COMMANDS.items() if name != command
                      and problem.key in importlib.import_module(spec.module).CONFIG_CLASS.model_fields]
        if owners:
            message = (f"unknown key '{problem.key}': it is a key of {', '.join(owners)}, not of rl {command} "
                       f"(`rl {command} --help` lists this command's keys)")
            problem = ConfigProblem(problem.where, problem.key, message)
        fixed.append(problem)
    return ConfigError(fixed)


def recipes_of(command: str) -> list[str]:
    """The packaged recipes ``rl <command>`` runs."""
    return [recipe for recipe in list_recipes() if command in recipe_commands(recipe)]


def _recipes() -> list[str]:
    rows = [(recipe, ", ".join(recipe_commands(recipe)) or "(none: it does not validate)", _first_comment(recipe))
            for recipe in list_recipes()]
    return _table(("recipe", "command", "what it does"), rows) + ["", "run one: rl <command> --config <recipe>"]


def _first_comment(recipe: str) -> str:
    """The first sentence of the recipe's leading comment."""
    lines = []
    with open(recipe_path(recipe), encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line.lstrip("#").strip())
    return _first_sentence(" ".join(lines))


def _envs() -> list[str]:
    from rl_environments.registry import environment_factory, list_environments

    rows = [(name, _summary(environment_factory(name))) for name in list_environments()]
    return _table(("environment", "what it grades"), rows) + [
        "", "use one: env.name=NAME env.kwargs={...}; your own: env.import_modules=[my_pkg.envs] (docs/environments.md)"]


def _models() -> list[str]:
    from rl_core.models.resolve import HUB_NAMES, SHORT_NAMES, model_cache_dir

    hub = {short: name for name, short in HUB_NAMES.items()}
    cache_dir = model_cache_dir()
    rows = [(name, hub.get(name, ""), "built" if (cache_dir / name / "config.json").is_file() else "built on first use")
            for name in sorted(SHORT_NAMES)]
    return _table(("model", "hub name", f"cache ({cache_dir})"), rows) + [
        "", "or the path of a local Hugging Face model directory (holding config.json); nothing is downloaded"]


def _summary(thing: object) -> str:
    return _first_sentence((getattr(thing, "__doc__", None) or "").replace("``", ""))


def _first_sentence(text: str, limit: int = 110) -> str:
    sentence = " ".join(text.split()).split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= limit else sentence[: limit - 3] + "..."


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) + 2 for i in range(len(header) - 1)]
    return ["".join(f"{cell:<{w}}" for cell, w in zip(row[:-1], widths)) + str(row[-1]) for row in [header, *rows]]


LISTS: dict[str, Callable[[], list[str]]] = {"recipes": _recipes, "envs": _envs, "models": _models}

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
