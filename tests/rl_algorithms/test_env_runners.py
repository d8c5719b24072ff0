"""Where environments run: Ray actors (a real local Ray) give the same episodes as threads; Ray actors
and worker processes isolate faulty environments (a hang or a death fails only its own episodes) and
are reusable afterwards; the config."""

from __future__ import annotations

import math
import os
import threading
import time

import pytest
from pydantic import ValidationError

from rl_algorithms.grpo import GRPOConfig
from rl_algorithms.rollout import EnvRunner, EnvRunnerConfig, RayEnvRunner, run_rollouts
from rl_core.types import PromptSample, SamplingParams, StepResult
from rl_environments import SlidingPuzzleDatasetConfig, SlidingPuzzleEnvironment


def sampling(tokenizer, max_new_tokens=5, seed=7) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed,
                          stop_token_ids=(tokenizer.eos_token_id,))


class ReportsPid:
    """Reward 1, and the id of the process that ran the step."""

    def step(self, messages, metadata, state):
        return StepResult(reward=1.0, reward_components={"ok": 1.0}, metrics={"pid": float(os.getpid())})


class SlowReportsPid(ReportsPid):
    """Takes a while: its steps are still running in the other worker when one dies."""

    def step(self, messages, metadata, state):
        time.sleep(0.3)
        return super().step(messages, metadata, state)


class Raises:
    def step(self, messages, metadata, state):
        raise RuntimeError("environment bug")


class Hangs:
    def step(self, messages, metadata, state):
        time.sleep(60)
        return StepResult(reward=1.0)


class Dies:
    """Takes its worker process down with it."""

    def step(self, messages, metadata, state):
        os._exit(3)


class Garbage:
    def __init__(self, value):
        self.value = value

    def step(self, messages, metadata, state):
        return self.value


class Unpicklable:
    """Holds a lock: cannot be sent to a worker process."""

    def __init__(self):
        self.lock = threading.Lock()

    def step(self, messages, metadata, state):
        return StepResult(reward=1.0)


def one_sample_per_env(environments) -> list[PromptSample]:
    return [PromptSample(messages=[{"role": "user", "content": f"Say {name}."}], env=name) for name in environments]


def next_round(engine, tokenizer, environments, runner, num_generations: int):
    """A following round of two "ok" prompts on the same runner: its episodes."""
    return run_rollouts(engine, tokenizer, one_sample_per_env(["ok"]) * 2, environments, sampling(tokenizer),
                        num_generations_per_prompt=num_generations, env_timeout_s=120.0, env_runner=runner)


def test_ray_actors_give_the_same_episodes_as_threads(ray_session, engine, tokenizer):
    samples = SlidingPuzzleDatasetConfig(scramble_moves=6).build("train", 2)
    env = SlidingPuzzleEnvironment()
    args = (tokenizer, samples, env, sampling(tokenizer))
    in_threads = run_rollouts(engine, *args, num_generations_per_prompt=2, max_turns=2)
    runner = EnvRunnerConfig(kind="ray", num_workers=2, cpus_per_worker=0.5).build(env)
    try:
        assert isinstance(runner, RayEnvRunner)
        on_ray = run_rollouts(engine, *args, num_generations_per_prompt=2, max_turns=2, env_runner=runner)
        again = run_rollouts(engine, *args, num_generations_per_prompt=2, max_turns=2, env_runner=runner)
    finally:
        runner.shutdown()
    for episodes in (on_ray, again):
        assert [e.token_ids for e in episodes] == [e.token_ids for e in in_threads]
        assert [e.loss_mask for e in episodes] == [e.loss_mask for e in in_threads]
        assert [e.messages for e in episodes] == [e.messages for e in in_threads]
        assert [e.metrics for e in episodes] == [e.metrics for e in in_threads]
        assert [e.num_turns for e in episodes] == [2, 2, 2, 2]
    assert runner.replaced_workers == 0


def test_ray_actors_isolate_faulty_environments(ray_session, engine, tokenizer):
    # The quick ones first; then one actor hangs and the other dies.
    environments = {
        "ok": ReportsPid(),
        "raises": Raises(),
        "none": Garbage(None),
        "nan": Garbage(StepResult(reward=math.nan)),
        "no_observation": Garbage(StepResult(reward=0.0, done=False)),
        "hangs": Hangs(),
        "dies": Dies(),
    }
    runner = RayEnvRunner(environments, num_workers=2, cpus_per_worker=0.5)
    try:
        start = time.monotonic()
        episodes = run_rollouts(engine, tokenizer, one_sample_per_env(environments), environments, sampling(tokenizer),
                                num_generations_per_prompt=1, max_turns=2, env_timeout_s=4.0, env_runner=runner)
        assert time.monotonic() - start < 30  # the hung actor was given up on after 4 s
        by_env = {e.sample.env: e for e in episodes}
        ok = by_env.pop("ok")
        assert (ok.env_error, ok.reward, ok.num_turns) == (False, 1.0, 1)
        assert ok.metrics["pid"] != os.getpid()  # stepped in an actor, not here
        for name, episode in by_env.items():
            assert (episode.env_error, episode.reward) == (True, 0.0), name
        assert by_env["raises"].error == "environment 'raises' raised RuntimeError: environment bug"
        assert by_env["none"].error == "environment returned NoneType, not a StepResult"
        assert "non-finite" in by_env["nan"].error
        assert "gave no observation" in by_env["no_observation"].error
        assert by_env["hangs"].error == "environment 'hangs' did not answer within 4 s"
        assert "ActorDiedError" in by_env["dies"].error
        # The hung actor was killed and the dead one lost: both replaced.
        assert runner.replaced_workers == 2
        # The runner is whole again: the next round runs on the fresh actors.
        again = next_round(engine, tokenizer, environments, runner, 2)
        assert [(e.env_error, e.reward) for e in again] == [(False, 1.0)] * 4
        assert all(e.metrics["pid"] != ok.metrics["pid"] for e in again)  # both first actors are gone
    finally:
        runner.shutdown()


def test_worker_process_is_replaced_after_a_hang(engine, tokenizer):
    environments = {"ok": ReportsPid(), "hangs": Hangs()}
    runner = EnvRunner(environments, num_workers=1)  # returns once the worker is up: the timeout measures the step
    try:
        episodes = run_rollouts(engine, tokenizer, one_sample_per_env(environments), environments, sampling(tokenizer),
                                num_generations_per_prompt=1, env_timeout_s=1.0, env_runner=runner)
        assert [(e.sample.env, e.env_error) for e in episodes] == [("ok", False), ("hangs", True)]
        assert runner.replaced_workers == 1  # the stuck worker was killed and replaced
        again = next_round(engine, tokenizer, environments, runner, 1)
        assert [(e.env_error, e.reward) for e in again] == [(False, 1.0)] * 2
    finally:
        runner.shutdown()


def test_worker_process_death_fails_only_its_own_episodes(engine, tokenizer):
    environments = {"ok": SlowReportsPid(), "dies": Dies()}
    runner = EnvRunner(environments, num_workers=2)
    try:
        samples = one_sample_per_env(["ok"]) * 4 + one_sample_per_env(["dies"]) + one_sample_per_env(["ok"]) * 4
        episodes = run_rollouts(engine, tokenizer, samples, environments, sampling(tokenizer),
                                num_generations_per_prompt=1, env_timeout_s=120.0, env_runner=runner)
        assert [e.sample.env for e in episodes] == ["ok"] * 4 + ["dies"] + ["ok"] * 4
        for episode in episodes:
            if episode.sample.env == "ok":  # stepped in the other or a fresh worker, untouched by the deaths
                assert (episode.env_error, episode.reward) == (False, 1.0)
                assert episode.metrics["pid"] != os.getpid()
            else:
                assert (episode.env_error, episode.reward) == (True, 0.0)
                assert episode.error.startswith("environment 'dies' raised BrokenProcessPool")
        assert runner.replaced_workers == 1  # the dying step took its worker down
        # The next round runs normally on the replacements (before: BrokenProcessPool at submit).
        again = next_round(engine, tokenizer, environments, runner, 2)
        assert [(e.env_error, e.reward) for e in again] == [(False, 1.0)] * 4
    finally:
        runner.shutdown()


def test_worker_processes_that_cannot_start_fail_at_construction():
    with pytest.raises(RuntimeError, match="environment worker processes could not start"):
        EnvRunner({"local": Unpicklable()}, num_workers=1)


def test_env_runner_config_is_strict_and_builds(engine, tokenizer):
    assert GRPOConfig().env_runner == EnvRunnerConfig(kind="thread", timeout_s=30.0)
    cfg = GRPOConfig.model_validate({"env_runner": {"kind": "ray", "num_workers": 3, "cpus_per_worker": 0.5}})
    assert (cfg.env_runner.kind, cfg.env_runner.num_workers, cfg.env_runner.cpus_per_worker) == ("ray", 3, 0.5)
    with pytest.raises(ValidationError, match="num_workers applies to kind 'process' or 'ray'"):
        EnvRunnerConfig(kind="thread", num_workers=4)
    with pytest.raises(ValidationError, match="cpus_per_worker applies to kind 'ray' only"):
        EnvRunnerConfig(kind="process", cpus_per_worker=2)
    with pytest.raises(ValidationError, match="workers"):
        EnvRunnerConfig.model_validate({"kind": "ray", "workers": 2})
    with pytest.raises(ValidationError, match="kind"):
        EnvRunnerConfig.model_validate({"kind": "actors"})
    threads = EnvRunnerConfig().build(ReportsPid())
    assert isinstance(threads, EnvRunner) and threads.num_workers == 0
    # A runner built from other environments than run_rollouts gets is refused up front.
    with pytest.raises(ValueError, match=r"env_runner has no environment named \['other'\]"):
        run_rollouts(engine, tokenizer, one_sample_per_env(["other"]), {"other": ReportsPid()}, sampling(tokenizer),
                     num_generations_per_prompt=1, env_runner=threads)
