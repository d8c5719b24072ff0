"""Running environment steps in Ray actors, with the fault isolation of the process pool.

Each actor holds its own copy of the environments (sent once, cloudpickled, when it starts) and runs
one task at a time. Tasks wait in a queue here and go to the next idle actor, so a hung environment
only holds up its own actor. When the rollout engine gives up on a task (``abandon``, after its
timeout) the actor running it is killed and a fresh one takes its place; an actor that dies (an
environment that segfaults or calls ``os._exit``) is replaced the same way. Either way the episode
scores 0 as an environment error and the run goes on.

Threads: ``submit`` and ``abandon`` run in the caller's thread; Ray completes results in its own
thread (``ObjectRef.future`` callbacks), which only does bookkeeping; one dispatcher thread sends
queued tasks to idle actors and starts replacement actors. No Ray call runs in Ray's callback thread
or while this runner's lock is held.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import sys
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from rl_algorithms.rollout.env_runner import StepInput, call_environment, environment_map
from rl_core.protocols import Environment

logger = logging.getLogger(__name__)


class EnvironmentActor:
    """What each Ray actor holds: the environments, unpickled after the driver's ``sys.path`` is
    added (so an environment class that the driver could import, e.g. from a test module, loads)."""

    def __init__(self, payload: bytes, driver_sys_path: list[str]):
        from ray import cloudpickle

        sys.path.extend(p for p in driver_sys_path if p not in sys.path)
        self.environments: Mapping[str, Environment] = cloudpickle.loads(payload)

    def ready(self) -> bool:
        return True

    def step(self, env_name: str, items: list[StepInput]) -> list[Any]:
        return call_environment(self.environments[env_name], items)


class RayEnvRunner:
    """Submits environment tasks to ``num_workers`` Ray actors (same interface as ``EnvRunner``).

    Ray must be running (``rl_core.cluster.init_ray``); the actors are ready when the constructor
    returns, or it raises with the reason (e.g. the environments could not be unpickled in a worker).
    """

    def __init__(self, environments: Mapping[str, Environment] | Environment, num_workers: int = 2, *,
                 cpus_per_worker: float = 1.0, startup_timeout_s: float = 120.0):
        import ray
        from ray import cloudpickle
        from ray.exceptions import GetTimeoutError, RayActorError

        if num_workers < 1:
            raise ValueError(f"RayEnvRunner needs num_workers >= 1, got {num_workers}")
        if not ray.is_initialized():
            raise RuntimeError("RayEnvRunner needs a running Ray: call rl_core.cluster.init_ray() first (the `rl` "
                               "commands do when grpo.env_runner.kind is 'ray')")
        self.environments = environment_map(environments)
        try:
            payload = cloudpickle.dumps(self.environments)
        except Exception as err:
            raise TypeError(f"the environments cannot be sent to Ray actors: they must be picklable (create heavy "
                            f"resources such as process pools or models lazily, where they are used): {err}") from err
        self._payload = ray.put(payload)
        self._actor_cls = ray.remote(EnvironmentActor).options(num_cpus=cpus_per_worker, max_restarts=0,
                                                               max_task_retries=0)
        self._cond = threading.Condition(threading.RLock())
        self._queue: deque[tuple[cf.Future, str, list[StepInput]]] = deque()
        self._idle: list = []
        self._running: dict[cf.Future, Any] = {}  # future -> the actor running its task
        self._to_replace = 0
        self._closed = False
        self.replaced_workers = 0
        """Actors killed (hung task) or lost (died) and replaced so far."""
        actors = [self._start_actor() for _ in range(num_workers)]
        try:
            ray.get([actor.ready.remote() for actor in actors], timeout=startup_timeout_s)
        except GetTimeoutError:
            self._kill(actors)
            raise TimeoutError(f"{num_workers} environment actors ({cpus_per_worker:g} CPUs each) did not start "
                               f"within {startup_timeout_s:g} s; the Ray cluster has "
                               f"{ray.available_resources().get('CPU', 0):g} CPUs free. Lower "
                               "grpo.env_runner.num_workers or cpus_per_worker, or give Ray more CPUs "
                               "(cluster.num_cpus)") from None
        except RayActorError as err:
            self._kill(actors)
            raise RuntimeError(f"the environment actors could not start (are the environments picklable and "
                               f"importable in a Ray worker?): {err}") from None
        self._idle = actors
        self._dispatcher = threading.Thread(target=self._dispatch_forever, name="ray-env-dispatch", daemon=True)
        self._dispatcher.start()

    def submit(self, env_name: str, items: list[StepInput]) -> cf.Future:
        future: cf.Future = cf.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("RayEnvRunner.submit after shutdown")
            self._queue.append((future, env_name, items))
            self._cond.notify()
        return future

    def abandon(self, future: cf.Future) -> None:
        """The engine gave up on ``future`` (timeout): kill the actor running it; a new one replaces it."""
        with self._cond:
            actor = self._running.pop(future, None)
            if actor is None:
                return  # still queued (the engine cancelled it) or already finished
            self._to_replace += 1
            self.replaced_workers += 1
            self._cond.notify()
        self._kill([actor])

    def recover(self) -> None:
        """Nothing to do: lost actors are replaced as soon as they are lost."""

    def shutdown(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            queued = [future for future, _, _ in self._queue]
            self._queue.clear()
            actors = [*self._idle, *self._running.values()]
            self._idle, self._running = [], {}
            self._cond.notify_all()
        for future in queued:
            future.cancel()
        self._kill(actors)
        self._dispatcher.join(timeout=10)

    # ------------------------------------------------------------------------------------- helpers

    def _start_actor(self):
        return self._actor_cls.remote(self._payload, list(sys.path))

    def _dispatch_forever(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._to_replace or (self._idle and self._queue))
                if self._closed:
                    return
                replacements, self._to_replace = self._to_replace, 0
                work = []
                while self._idle and self._queue:
                    future, env_name, items = self._queue.popleft()
                    if not future.set_running_or_notify_cancel():
                        continue  # cancelled while queued
                    actor = self._idle.pop()
                    self._running[future] = actor
                    work.append((future, actor, env_name, items))
            # Ray calls happen outside the lock, which Ray's callback thread takes in _finished.
            for future, actor, env_name, items in work:
                try:
                    ref = actor.step.remote(env_name, items)
                except Exception as err:  # noqa: BLE001 - e.g. arguments Ray cannot serialise: that step fails
                    with self._cond:
                        self._running.pop(future, None)
                        self._idle.append(actor)
                    future.set_exception(err)
                    continue
                ref.future().add_done_callback(functools.partial(self._finished, future, actor))
            if replacements:
                fresh = [self._start_actor() for _ in range(replacements)]
                with self._cond:
                    closed = self._closed
                    if not closed:
                        self._idle += fresh
                        self._cond.notify()
                if closed:
                    self._kill(fresh)
                    return

    def _finished(self, future: cf.Future, actor, ray_future: cf.Future) -> None:
        """In Ray's callback thread: hand the result over and the actor back (bookkeeping only)."""
        from ray.exceptions import RayActorError, RayTaskError

        error = ray_future.exception()
        with self._cond:
            if self._running.get(future) is not actor:
                return  # abandoned: the actor was killed and replaced
            del self._running[future]
            if isinstance(error, RayActorError):
                logger.warning("an environment actor died (%s); starting a new one", error)
                self._to_replace += 1
                self.replaced_workers += 1
            elif not self._closed:
                self._idle.append(actor)
            self._cond.notify()
        if error is None:
            future.set_result(ray_future.result())
        else:
            # The environment's own exception, not Ray's wrapper, so errors read as with threads or processes.
            future.set_exception(error.cause if isinstance(error, RayTaskError) else error)

    @staticmethod
    def _kill(actors: list) -> None:
        import ray

        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as err:  # noqa: BLE001 - it may be dead already
                logger.debug("ray.kill of an environment actor: %s", err)
