"""Running environment steps next to generation: in daemon threads or in a pool of processes
(Ray actors: ``ray_env_runner.RayEnvRunner``, the same interface).

A task is one call of an environment on one or more episodes (``step_batch`` when the environment
has it, else ``step``). Results are checked here: anything that is not a well-formed ``StepResult``
with finite rewards counts as an environment error, never as a crash of the run.

A runner: ``environments`` (name -> environment), ``submit(env_name, items) -> Future``,
``abandon(future)`` (the engine gave up on a task after its timeout), ``recover()`` (after a round of
rollouts: replace workers lost to hung tasks, so the runner can be reused) and ``shutdown()``.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing
import os
import signal
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from rl_core.protocols import Environment
from rl_core.types import StepResult

StepInput = tuple[list[dict[str, str]], dict[str, Any], dict | None]  # (messages, metadata, state)

_WORKER_ENVS: Mapping[str, Environment] = {}
SINGLE_ENV = "__env__"
"""The name a lone environment (not a mapping) goes by."""


class StepRunner(Protocol):
    """What the rollout engine needs from a runner (``EnvRunner``, ``RayEnvRunner``)."""

    environments: Mapping[str, Environment]

    def submit(self, env_name: str, items: list[StepInput]) -> cf.Future: ...

    def abandon(self, future: cf.Future) -> None: ...

    def recover(self) -> None: ...

    def shutdown(self) -> None: ...


def environment_map(environments: Mapping[str, Environment] | Environment) -> dict[str, Environment]:
    """``environments`` as a name -> environment dict (a lone environment is named ``SINGLE_ENV``)."""
    if isinstance(environments, Mapping):
        if not environments:
            raise ValueError("run_rollouts needs at least one environment")
        return dict(environments)
    if not hasattr(environments, "step"):
        raise TypeError(f"{type(environments).__name__} is not an Environment (it has no step method)")
    return {SINGLE_ENV: environments}


def call_environment(env: Environment, items: list[StepInput]) -> list[Any]:
    """Step ``env`` on ``items`` (batched when it has ``step_batch``)."""
    step_batch = getattr(env, "step_batch", None)
    if step_batch is not None and len(items) > 1:
        return list(step_batch(items))
    return [env.step(messages, metadata, state) for messages, metadata, state in items]


def _init_worker(environments: Mapping[str, Environment]) -> None:
    global _WORKER_ENVS
    _WORKER_ENVS = environments


def _step_in_worker(env_name: str, items: list[StepInput]) -> list[Any]:
    return call_environment(_WORKER_ENVS[env_name], items)


def check_step_result(result: Any) -> str | None:
    """Why ``result`` is not a usable StepResult, or None when it is."""
    if not isinstance(result, StepResult):
        return f"environment returned {type(result).__name__}, not a StepResult"
    if not _finite_number(result.reward):
        return f"environment returned a non-finite or non-numeric reward {result.reward!r}"
    if not isinstance(result.reward_components, Mapping) or not all(
            isinstance(k, str) and _finite_number(v) for k, v in result.reward_components.items()):
        return f"environment returned bad reward_components {result.reward_components!r}"
    if not isinstance(result.metrics, Mapping) or not all(_finite_number(v) for v in result.metrics.values()):
        return f"environment returned bad metrics {result.metrics!r}"
    if not result.done and not isinstance(result.observation, str):
        return "environment wants another turn (done=False) but gave no observation text"
    return None


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class EnvRunner:
    """Submits environment tasks; ``num_workers == 0`` runs them in daemon threads of this process
    (a hung environment cannot block exit), ``> 0`` in a process pool (forkserver) that received the
    environments once at start-up."""

    def __init__(self, environments: Mapping[str, Environment] | Environment, num_workers: int = 0):
        self.environments = environment_map(environments)
        self.num_workers = num_workers
        self._pool: cf.ProcessPoolExecutor | None = None
        self.broken = False
        if num_workers > 0:
            self._pool = self._new_pool()

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        return cf.ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context(method),
                                      initializer=_init_worker, initargs=(self.environments,))

    def submit(self, env_name: str, items: list[StepInput]) -> cf.Future:
        if self._pool is not None:
            return self._pool.submit(_step_in_worker, env_name, items)
        future: cf.Future = cf.Future()
        env = self.environments[env_name]

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(call_environment(env, items))
            except BaseException as err:  # noqa: BLE001 - reported as an environment error
                future.set_exception(err)

        threading.Thread(target=work, name=f"env-{env_name}", daemon=True).start()
        return future

    def abandon(self, future: cf.Future) -> None:
        """A task timed out: in pool mode its worker may be stuck forever, so the pool must go
        (at ``recover`` or ``shutdown``). A hung thread is left behind (daemon)."""
        self.broken = True

    def recover(self) -> None:
        """After a round of rollouts (no task of it pending): replace a pool that has a hung worker."""
        if self._pool is not None and self.broken:
            self.shutdown()
            self._pool, self.broken = self._new_pool(), False

    def shutdown(self) -> None:
        if self._pool is None:
            return
        processes = list((self._pool._processes or {}).values())  # noqa: SLF001 - stuck workers must be killed
        self._pool.shutdown(wait=not self.broken, cancel_futures=True)
        if self.broken:
            for process in processes:
                if process.is_alive():
                    try:
                        os.kill(process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self._pool = None
