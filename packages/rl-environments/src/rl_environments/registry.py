"""Environments by name: ``register_environment``, ``build_environment``, ``list_environments``."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from rl_core.protocols import Environment

_FACTORIES: dict[str, Callable[..., Environment]] = {}


def register_environment(name: str, factory: Callable[..., Environment], *, overwrite: bool = False) -> None:
    """Make ``build_environment(name, **kwargs)`` call ``factory(**kwargs)``."""
    if name in _FACTORIES and not overwrite and _FACTORIES[name] is not factory:
        raise ValueError(f"environment {name!r} is already registered; pass overwrite=True to replace it")
    _FACTORIES[name] = factory


def list_environments() -> list[str]:
    return sorted(_FACTORIES)


def environment_factory(name: str) -> Callable[..., Environment]:
    """What ``build_environment(name)`` calls (its docstring says what the environment grades)."""
    return _FACTORIES[name]


def build_environment(name: str, **kwargs: Any) -> Environment:
    """A new environment of the registered kind ``name``."""
    if name not in _FACTORIES:
        close = difflib.get_close_matches(name, list(_FACTORIES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown environment {name!r}.{hint} Registered: {', '.join(list_environments())}")
    try:
        return _FACTORIES[name](**kwargs)
    except TypeError as err:
        raise TypeError(f"building environment {name!r} with {sorted(kwargs)}: {err}") from err


def _register_builtins() -> None:
    from rl_environments.arithmetic import ArithmeticEnvironment
    from rl_environments.code_env import CodeEnvironment
    from rl_environments.countdown import CountdownEnvironment
    from rl_environments.math_env import MathEnvironment
    from rl_environments.reward_function import reward_function_environment
    from rl_environments.reward_model import RewardModelEnvironment
    from rl_environments.shapes import ShapesEnvironment
    from rl_environments.sliding_puzzle import SlidingPuzzleEnvironment
    from rl_environments.tools import ToolsEnvironment

    for name, factory in {
        "arithmetic": ArithmeticEnvironment, "countdown": CountdownEnvironment, "math": MathEnvironment,
        "code": CodeEnvironment, "tools": ToolsEnvironment, "sliding_puzzle": SlidingPuzzleEnvironment,
        "reward_model": RewardModelEnvironment, "reward_function": reward_function_environment,
        "shapes": ShapesEnvironment,
    }.items():
        register_environment(name, factory)


_register_builtins()
