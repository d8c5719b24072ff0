"""The registry, EnvConfig, and plain reward functions loaded by import path."""

from __future__ import annotations

import pickle
import sys
import textwrap

import pytest
from pydantic import ValidationError

from rl_environments import (
    ArithmeticEnvironment,
    EnvConfig,
    build_environment,
    list_environments,
    register_environment,
    reward_function_environment,
)


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        def length_bonus(prompt, completion, **metadata):
            return len(completion) / 10

        def graded(prompt, completion, answer=None, **metadata):
            return {"correct": float(completion.strip() == answer), "short": float(len(completion) < 5)}

        def broken(prompt, completion, **metadata):
            return "high"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def said(text):
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


def test_builtins_are_registered_and_unknown_names_suggest():
    assert {"arithmetic", "countdown", "math", "code", "tools", "sliding_puzzle", "reward_model",
            "reward_function"} <= set(list_environments())
    assert isinstance(build_environment("arithmetic", answer_format="either"), ArithmeticEnvironment)
    with pytest.raises(KeyError, match="Did you mean 'arithmetic'"):
        build_environment("arithmetik")
    with pytest.raises(TypeError, match="building environment 'arithmetic'"):
        build_environment("arithmetic", answer_fmt="boxed")


def test_register_a_custom_environment():
    class Echo:
        def step(self, messages, metadata, state):
            from rl_core.types import StepResult

            return StepResult(reward=float(len(messages)))

    register_environment("echo-test", Echo)
    assert build_environment("echo-test").step(said("x"), {}, None).reward == 2.0
    with pytest.raises(ValueError, match="already registered"):
        register_environment("echo-test", lambda: Echo())


def test_reward_function_by_import_path(reward_module):
    env = reward_function_environment(f"{reward_module}:length_bonus")
    assert env.step(said("12345"), {}, None).reward == 0.5
    graded = EnvConfig(name="reward_function", kwargs={"fn": f"{reward_module}:graded",
                                                       "weights": {"correct": 1.0, "short": 0.5}}).build()
    result = graded.step(said("42"), {"answer": "42"}, None)
    assert result.reward_components == {"correct": 1.0, "short": 1.0} and result.reward == 1.5
    clone = pickle.loads(pickle.dumps(graded))  # re-imported by path in a worker
    assert clone.step(said("41"), {"answer": "42"}, None).reward == 0.5
    with pytest.raises(TypeError, match="expected a float or dict"):
        reward_function_environment(f"{reward_module}:broken").step(said("x"), {}, None)


def test_bad_import_paths_are_clear_errors(reward_module):
    with pytest.raises(ValueError, match="must look like 'package.module:function'"):
        reward_function_environment("my_rewards.length_bonus")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        reward_function_environment("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        reward_function_environment(f"{reward_module}:nope")


def test_env_config_is_strict_and_imports_modules(tmp_path, monkeypatch):
    with pytest.raises(ValidationError):
        EnvConfig(name="arithmetic", kwarg={})
    (tmp_path / "my_envs.py").write_text(textwrap.dedent("""
        from rl_environments import register_environment, ArithmeticEnvironment
        register_environment("my-arith", ArithmeticEnvironment)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    env = EnvConfig(name="my-arith", import_modules=["my_envs"], kwargs={"answer_format": "last_number"}).build()
    assert env.step(said("it is 5"), {"answer": "5"}, None).reward == 1.0


def test_environments_pickle():
    for name in ["arithmetic", "countdown", "math", "code", "tools", "sliding_puzzle"]:
        env = build_environment(name)
        assert type(pickle.loads(pickle.dumps(env))) is type(env)
