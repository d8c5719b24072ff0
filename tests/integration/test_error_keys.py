"""Every config key an error message names exists: the dotted keys in the messages of rl-algorithms,
rl-eval, rl-environments and the `rl` commands resolve in a command's config, and a few errors whose
key is built at run time are triggered and checked the same way."""

from __future__ import annotations

import ast
import importlib
import re
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from rl_apps.commands import COMMANDS
from rl_core.config import ConfigError, load_config

ROOT = Path(__file__).parents[2]
SOURCES = [ROOT / "packages/rl-algorithms/src", ROOT / "packages/rl-eval/src", ROOT / "apps/src",
           ROOT / "packages/rl-environments/src"]
CONFIGS = {name: importlib.import_module(spec.module).CONFIG_CLASS for name, spec in COMMANDS.items()}



def _sections(model: type[BaseModel], seen: set) -> set[str]:
    """Names of every field, at any depth (a message naming ``advantage.x`` must say ``grpo.advantage.x``)."""
    names = set()
    for name, field in model.model_fields.items():
        names.add(name)
        for member in _members(field.annotation):
            for tp in [member, *typing.get_args(member)]:
                if isinstance(tp, type) and issubclass(tp, BaseModel) and tp not in seen:
                    seen.add(tp)
                    names |= _sections(tp, seen)
    return names


# A dotted key: segments of lowercase words (or list indices) starting with a config key of any level.
KEY = re.compile(r"(?<![\w.])([a-z_]+(?:\.(?:[a-z_][a-z_0-9]*|\d+))+)")
ERROR_CALLS = re.compile(r"(Error|Problem|BadRow|Exception)$")


def _members(annotation) -> list:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [annotation]


def resolves(path: str, model: type[BaseModel]) -> bool:
    """Whether ``path`` names a key below ``model`` (any member of a union; any key of a dict of Any)."""
    candidates: list = [model]
    for part in path.split("."):
        found = []
        for tp in candidates:
            origin, args = typing.get_origin(tp), typing.get_args(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
                found += _members(tp.model_fields[part].annotation)
            elif origin is dict and args:
                if args[1] is typing.Any:
                    return True
                found += _members(args[1])
            elif origin is list and args and part.isdigit():
                found += _members(args[0])
        if not found:
            return False
        candidates = found
    return True


KEY_NAMES = {name for cls in CONFIGS.values() for name in _sections(cls, set())}


def message_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """The string pieces of every raised error and every error/problem object built."""
    out = []
    for node in ast.walk(tree):
        is_error = isinstance(node, ast.Raise) or (
            isinstance(node, ast.Call) and ERROR_CALLS.search(getattr(node.func, "id", getattr(node.func, "attr", ""))))
        if is_error:
            out += [(n.lineno, n.value) for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return out


def named_keys() -> list[tuple[str, str]]:
    found = []
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            for line, text in message_strings(ast.parse(path.read_text())):
                for key in KEY.findall(text):
                    if key.split(".")[0] in KEY_NAMES:
                        found.append((f"{path.relative_to(ROOT)}:{line}", key))
    return found


def test_the_walk_finds_the_messages():
    keys = {key for _, key in named_keys()}
    assert {"data.train_path", "grpo.max_total_length", "loss.objective", "policy.micro_batch_size"} <= keys
    assert len(keys) > 20


def test_every_key_named_in_an_error_message_exists():
    missing = sorted({f"{where}: {key}" for where, key in named_keys()
                      if not any(resolves(key, cls) for cls in CONFIGS.values())})
    assert not missing, "error messages name keys no config has:\n" + "\n".join(missing)


@pytest.mark.parametrize(("command", "overrides", "key"), [
    ("dpo", ["dpo.batch_size=3", "policy.use_ray=true", "policy.num_workers=2"], "dpo.batch_size"),
    ("rm", ["policy.micro_batch_size=3"], "policy.micro_batch_size"),
    ("grpo", ["grpo.batch_size=3", "grpo.num_generations_per_prompt=3", "grpo.num_minibatches=2"],
     "grpo.num_minibatches"),
    ("grpo", ["grpo.env_runner.num_workers=3"], "grpo.env_runner.num_workers"),
    ("grpo", ["grpo.advantage.estimator=gdpo"], "grpo.advantage.gdpo_weights"),
    ("grpo", ["grpo.dapo.overlong_buffer_length=1000"], "grpo.dapo.overlong_buffer_length"),
    ("grpo", ["loss.kind=gspo", "loss.objective=cispo"], "loss.objective"),
    ("eval", ["k_values=[8]"], "sampling.n"),
])
def test_triggered_config_errors_name_real_keys(command, overrides, key):
    cls = CONFIGS[command]
    module = importlib.import_module(COMMANDS[command].module)
    with pytest.raises(ConfigError) as err:
        load_config(cls, module.DEFAULT_RECIPE, overrides)
    assert key in str(err.value) and resolves(key, cls)
