"""Plain reward functions as environments: ``(prompt, completion, **metadata) -> float | dict[str, float]``.

Loaded by import path (``"my_pkg.rewards:length_penalty"``) so a config can name them.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping

from rl_core.types import StepResult
from rl_environments.answers import last_assistant_text

RewardFn = Callable[..., float | Mapping[str, float]]


def load_callable(path: str) -> Callable:
    """``"package.module:attribute"`` -> the object. Errors say what is wrong and how to write it."""
    if not isinstance(path, str) or path.count(":") != 1:
        raise ValueError(f"reward function path {path!r} must look like 'package.module:function'")
    module_name, attr = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} for reward function {path!r}: {err}") from err
    try:
        fn = getattr(module, attr)
    except AttributeError as err:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (reward function {path!r})") from err
    if not callable(fn):
        raise ValueError(f"{path!r} is not callable")
    return fn


class RewardFunctionEnvironment:
    """Single-turn environment around a reward function. A dict result's values are components; the
    total is their weighted sum (``weights``, default 1 each)."""

    def __init__(self, fn: RewardFn | str, weights: Mapping[str, float] | None = None):
        self.fn_path = fn if isinstance(fn, str) else None
        self.fn = load_callable(fn) if isinstance(fn, str) else fn
        self.weights = dict(weights or {})

    def __getstate__(self):  # re-import by path in workers when we have one
        state = self.__dict__.copy()
        if self.fn_path is not None:
            state["fn"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.fn is None:
            self.fn = load_callable(self.fn_path)

    def step(self, messages, metadata, state) -> StepResult:
        prompt = [m for m in messages[:-1]]
        value = self.fn(prompt, last_assistant_text(messages), **metadata)
        if isinstance(value, Mapping):
            components = {str(k): float(v) for k, v in value.items()}
            unknown = set(self.weights) - set(components)
            if unknown:
                raise ValueError(f"reward weights name components {sorted(unknown)} the function did not return "
                                 f"(it returned {sorted(components)})")
            total = sum(self.weights.get(k, 1.0) * v for k, v in components.items())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            components, total = {}, float(value)
        else:
            raise TypeError(f"reward function returned {type(value).__name__}; expected a float or dict[str, float]")
        if not math.isfinite(total):
            raise ValueError(f"reward function returned a non-finite reward {total}")
        return StepResult(reward=total, reward_components=components, done=True)


def reward_function_environment(fn: RewardFn | str, weights: Mapping[str, float] | None = None
                                ) -> RewardFunctionEnvironment:
    """An environment from a reward function or its import path ``"pkg.module:fn"``."""
    return RewardFunctionEnvironment(fn, weights)
