"""Running environment steps in Ray actors, with the fault isolation of the worker processes.

Each actor holds its own copy of the environments (sent once, cloudpickled, when it starts) and runs
one task at a time; queueing, timeouts and replacing hung or dead actors are ``WorkerPool``'s
(``env_runner.py``): a hung environment only holds up its own actor, and one that kills its actor
(a segfault, ``os._exit``) fails only its own task. Ray completes results in its own thread
(``ObjectRef.future`` callbacks).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import sys
from collections.abc import Mapping
from typing import Any

from rl_algorithms.rollout.env_runner import StepInput, WorkerPool, call_environment
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


class RayEnvRunner(WorkerPool):
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
        super().__init__(environments)
        try:
            payload = cloudpickle.dumps(self.environments)
        except Exception as err:
            raise TypeError(f"the environments cannot be sent to Ray actors: they must be picklable (create heavy "
                            f"resources such as process pools or models lazily, where they are used): {err}") from err
        self._payload = ray.put(payload)
        self._actor_cls = ray.remote(EnvironmentActor).options(num_cpus=cpus_per_worker, max_restarts=0,
                                                               max_task_retries=0)
        actors = [self._start_worker() for _ in range(num_workers)]
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
        self._open(actors)

    def _start_worker(self):
        return self._actor_cls.remote(self._payload, list(sys.path))

    def _run(self, actor, env_name: str, items: list[StepInput]) -> cf.Future:
        return actor.step.remote(env_name, items).future()

    def _is_death(self, error: BaseException) -> bool:
        from ray.exceptions import RayActorError

        return isinstance(error, RayActorError)

    def _unwrap(self, error: BaseException) -> BaseException:
        """The environment's own exception, not Ray's wrapper, so errors read as with threads or processes."""
        from ray.exceptions import RayTaskError

        return error.cause if isinstance(error, RayTaskError) else error

    def _kill(self, actors: list) -> None:
        import ray

        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as err:  # noqa: BLE001 - it may be dead already
                logger.debug("ray.kill of an environment actor: %s", err)
