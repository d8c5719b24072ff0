"""Running environment steps next to generation: in daemon threads or in worker processes
(Ray actors: ``ray_env_runner.RayEnvRunner``, the same interface and the same ``WorkerPool``).

A task is one call of an environment on one or more episodes (``step_batch`` when the environment
has it, else ``step``). Results are checked here: anything that is not a well-formed ``StepResult``
with finite rewards counts as an environment error, never as a crash of the run.

A runner: ``environments`` (name -> environment), ``submit(env_name, items) -> Future``,
``abandon(future)`` (the engine gave up on a task after its timeout), ``recover()`` (after a round of
rollouts, so the runner can be reused) and ``shutdown()``.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import math
import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from rl_core.protocols import Environment
from rl_core.types import StepResult

logger = logging.getLogger(__name__)

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


class WorkerPool:
    """Tasks wait in a queue here and go to the next idle worker, one task per worker at a time, so a
    hung environment holds up only its own worker and one that takes its worker down (a segfault,
    ``os._exit``) fails only its own task. When the engine gives up on a task (``abandon``, after its
    timeout) its worker is killed; a worker that died is cleaned up; either way a fresh one takes its
    place at once, the episode scores 0 as an environment error and the run goes on.

    Subclasses say what a worker is: ``_start_worker``, ``_run`` (start a task on an idle worker: a
    ``concurrent.futures.Future`` of its result), ``_is_death`` (this error means the worker is gone),
    ``_unwrap`` (the environment's own exception), ``_kill`` (stop workers now) and ``_close``
    (stop idle workers); a constructor starts its workers and hands them to ``_open``.

    Threads: ``submit`` and ``abandon`` run in the caller's thread; tasks complete in the workers'
    callback threads, which only do bookkeeping; one dispatcher thread sends queued tasks to idle
    workers, cleans up lost ones and starts replacements. No worker call runs in a callback thread or
    while the lock is held.
    """

    def __init__(self, environments: Mapping[str, Environment] | Environment):
        self.environments = environment_map(environments)
        self._cond = threading.Condition(threading.RLock())
        self._queue: deque[tuple[cf.Future, str, list[StepInput]]] = deque()
        self._idle: list = []
        self._running: dict[cf.Future, Any] = {}  # future -> the worker running its task
        self._lost: list = []  # workers that died, still to clean up
        self._to_replace = 0
        self._closed = False
        self.replaced_workers = 0
        """Workers killed (hung task) or lost (died) and replaced so far."""

    def _open(self, workers: list) -> None:
        self._idle = list(workers)
        self._dispatcher = threading.Thread(target=self._dispatch_forever, name=f"{type(self).__name__}-dispatch",
                                            daemon=True)
        self._dispatcher.start()

    def submit(self, env_name: str, items: list[StepInput]) -> cf.Future:
        future: cf.Future = cf.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__}.submit after shutdown")
            self._queue.append((future, env_name, items))
            self._cond.notify()
        return future

    def abandon(self, future: cf.Future) -> None:
        """The engine gave up on ``future`` (timeout): kill the worker running it; a new one replaces it."""
        with self._cond:
            worker = self._running.pop(future, None)
            if worker is None:
                return  # still queued (the engine cancelled it) or already finished
            self._to_replace += 1
            self.replaced_workers += 1
            self._cond.notify()
        self._kill([worker])

    def recover(self) -> None:
        """Nothing to do: lost workers are replaced as soon as they are lost."""

    def shutdown(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            queued = [future for future, _, _ in self._queue]
            self._queue.clear()
            idle, running, lost = self._idle, list(self._running.values()), self._lost
            self._idle, self._running, self._lost = [], {}, []
            self._cond.notify_all()
        for future in queued:
            future.cancel()
        self._kill(running + lost)
        self._close(idle)
        self._dispatcher.join(timeout=10)

    def _dispatch_forever(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._to_replace or (self._idle and self._queue))
                if self._closed:
                    return
                replacements, self._to_replace = self._to_replace, 0
                lost, self._lost = self._lost, []
                work = []
                while self._idle and self._queue:
                    future, env_name, items = self._queue.popleft()
                    if not future.set_running_or_notify_cancel():
                        continue  # cancelled while queued
                    worker = self._idle.pop()
                    self._running[future] = worker
                    work.append((future, worker, env_name, items))
            # Worker calls happen outside the lock, which the callback threads take in _finished.
            for future, worker, env_name, items in work:
                try:
                    task = self._run(worker, env_name, items)
                except Exception as err:  # noqa: BLE001 - e.g. arguments that cannot be sent: that step fails
                    with self._cond:
                        self._running.pop(future, None)
                        self._idle.append(worker)
                    future.set_exception(err)
                    continue
                task.add_done_callback(functools.partial(self._finished, future, worker))
            self._kill(lost)
            if replacements:
                fresh = [self._start_worker() for _ in range(replacements)]
                with self._cond:
                    closed = self._closed
                    if not closed:
                        self._idle += fresh
                        self._cond.notify()
                if closed:
                    self._kill(fresh)
                    return

    def _finished(self, future: cf.Future, worker, task: cf.Future) -> None:
        """In a worker's callback thread: hand the result over and the worker back (bookkeeping only)."""
        error = cf.CancelledError() if task.cancelled() else task.exception()
        with self._cond:
            if self._running.get(future) is not worker:
                return  # abandoned: the worker was killed and replaced
            del self._running[future]
            if error is not None and self._is_death(error):
                logger.warning("an environment worker died (%s); starting a new one", error)
                self._lost.append(worker)
                self._to_replace += 1
                self.replaced_workers += 1
            elif not self._closed:
                self._idle.append(worker)
            self._cond.notify()
        if error is None:
            future.set_result(task.result())
        else:
            future.set_exception(self._unwrap(error))

    # What a worker is: subclasses.
    def _start_worker(self) -> Any:
        raise NotImplementedError

    def _run(self, worker, env_name: str, items: list[StepInput]) -> cf.Future:
        raise NotImplementedError

    def _is_death(self, error: BaseException) -> bool:
        raise NotImplementedError

    def _unwrap(self, error: BaseException) -> BaseException:
        return error

    def _kill(self, workers: list) -> None:
        raise NotImplementedError

    def _close(self, workers: list) -> None:
        self._kill(workers)


class ProcessWorkers(WorkerPool):
    """``num_workers`` worker processes on this machine (forkserver), each a one-process executor that
    received the environments once when it started. The constructor waits until all are up."""

    def __init__(self, environments: Mapping[str, Environment] | Environment, num_workers: int,
                 startup_timeout_s: float = 120.0):
        super().__init__(environments)
        if num_workers < 1:
            raise ValueError(f"ProcessWorkers needs num_workers >= 1, got {num_workers}")
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self._context = multiprocessing.get_context(method)
        workers = [self._start_worker() for _ in range(num_workers)]
        try:
            for started in [worker.submit(_ready) for worker in workers]:
                started.result(timeout=startup_timeout_s)
        except Exception as err:
            self._kill(workers)
            raise RuntimeError(f"the environment worker processes could not start (are the environments "
                               f"picklable and importable in a fresh process?): {type(err).__name__}: {err}") from None
        self._open(workers)

    def _start_worker(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(1, mp_context=self._context, initializer=_init_worker,
                                      initargs=(self.environments,))

    def _run(self, worker: cf.ProcessPoolExecutor, env_name: str, items: list[StepInput]) -> cf.Future:
        return worker.submit(_step_in_worker, env_name, items)

    def _is_death(self, error: BaseException) -> bool:
        return isinstance(error, BrokenProcessPool)

    def _kill(self, workers: list[cf.ProcessPoolExecutor]) -> None:
        for worker in workers:
            processes = list((worker._processes or {}).values())  # noqa: SLF001 - a hung one must be killed
            for process in processes:
                if process.is_alive():
                    try:
                        os.kill(process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            worker.shutdown(wait=False, cancel_futures=True)

    def _close(self, workers: list[cf.ProcessPoolExecutor]) -> None:
        for worker in workers:
            worker.shutdown(wait=True, cancel_futures=True)


def _ready() -> bool:
    return True


class EnvRunner:
    """Submits environment tasks; ``num_workers == 0`` runs them in daemon threads of this process
    (a hung environment cannot block exit), ``> 0`` in that many worker processes (``ProcessWorkers``)."""

    def __init__(self, environments: Mapping[str, Environment] | Environment, num_workers: int = 0):
        self.environments = environment_map(environments)
        self.num_workers = num_workers
        self._workers = ProcessWorkers(self.environments, num_workers) if num_workers > 0 else None

    @property
    def replaced_workers(self) -> int:
        """Worker processes killed (hung task) or lost (died) and replaced so far."""
        return 0 if self._workers is None else self._workers.replaced_workers

    def submit(self, env_name: str, items: list[StepInput]) -> cf.Future:
        if self._workers is not None:
            return self._workers.submit(env_name, items)
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
        """A task timed out: its worker process is killed and replaced; a hung thread is left behind (daemon)."""
        if self._workers is not None:
            self._workers.abandon(future)

    def recover(self) -> None:
        """Nothing to do: lost worker processes are replaced as soon as they are lost."""

    def shutdown(self) -> None:
        if self._workers is not None:
            self._workers.shutdown()
