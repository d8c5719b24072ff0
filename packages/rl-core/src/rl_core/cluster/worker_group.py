"""A group of N ranks with torch.distributed set up, each holding one instance of a worker class.

With Ray (the default) every rank is an actor in a placement group (PACK). With ``use_ray=False``
exactly one rank runs inside this process (world size 1): the same API, for fast tests.

Failure handling: every wait polls ``ray.wait`` so that a rank that raises or dies is seen within
about a second. When one rank fails while others are still running (for example blocked in a
collective waiting for the failed one), the group is killed after a short grace period and
``WorkerError`` is raised; the driver never hangs.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from typing import Any

from rl_core.cluster.errors import WorkerError
from rl_core.cluster.rank import RankFailure, RankRuntime, free_port

logger = logging.getLogger(__name__)

_POLL_S = 0.5
# After one rank fails, how long the others get to finish before the group is declared broken.
_GRACE_S = 3.0
_TEARDOWN_TIMEOUT_S = 10.0
_ANSI_COLOR = re.compile(r"\x1b\[[0-9;]*m")
_RANK_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class WorkerFutures:
    """Pending results of one call on one or more ranks; resolve them with ``WorkerGroup.get``."""

    def __init__(self, method: str, ranks: list[int], refs: list | None = None, results: list | None = None,
                 error: WorkerError | None = None, single: bool = False):
        self.method = method
        self.ranks = ranks
        self.refs = refs
        self.results = results
        self.error = error
        self.single = single


class _LocalProcessGroup:
    """Reference count of in-process groups sharing this process's world-size-1 process group."""

    users = 0
    owned = False
    saved_env: dict[str, str | None] = {}


class WorkerGroup:
    """N ranks of ``worker_cls`` with torch.distributed initialised before the worker is built.

    Args:
        worker_cls: the class each rank instantiates as ``worker_cls(*init_args, **init_kwargs)``.
        num_workers: world size.
        cpus_per_worker: logical CPUs each rank's placement-group bundle reserves.
        gpus_per_worker: GPUs per rank (0 on CPU; with CUDA the backend is nccl for CUDA tensors).
        env_vars: extra environment variables for the ranks (on top of the cluster defaults).
        name: shown in errors and logs.
        torch_threads: ``torch.set_num_threads`` in each rank. None: ``ceil(cpus_per_worker)`` in Ray
            actors; left unchanged in-process.
        use_ray: False runs one rank inside this process (``num_workers`` must be 1).
        timeout_s: limit for each call (and for the workers' construction); None waits forever.
            A call over the limit kills the group and raises ``WorkerError``.
        startup_timeout_s: limit for scheduling the placement group and joining torch.distributed.
        pg_timeout_s: torch.distributed timeout for collectives.
        placement_strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD. None: ``cluster.placement_strategy``
            of the config given to ``init_ray`` (PACK by default).
        resources: custom Ray resources each rank's bundle reserves (pins the ranks to nodes that have
            them). None: ``cluster.group_resources[name]`` of the config given to ``init_ray``.
    """

    def __init__(self, worker_cls: type, num_workers: int, *, init_args: tuple = (),
                 init_kwargs: dict[str, Any] | None = None, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
                 env_vars: dict[str, str] | None = None, name: str = "workers", torch_threads: int | None = None,
                 use_ray: bool = True, timeout_s: float | None = None, startup_timeout_s: float = 120.0,
                 pg_timeout_s: float = 1800.0, placement_strategy: str | None = None,
                 resources: dict[str, float] | None = None):
        if num_workers < 1:
            raise ValueError(f"WorkerGroup {name!r}: num_workers must be >= 1, got {num_workers}")
        if not use_ray and num_workers != 1:
            raise ValueError(f"WorkerGroup {name!r}: use_ray=False runs exactly one worker in-process; "
                             f"got num_workers={num_workers}. Use use_ray=True for more.")
        self.name = name
        self.world_size = num_workers
        self.use_ray = use_ray
        self.timeout_s = timeout_s
        self._closed = False
        self._healthy = True
        self._actors: list = []
        self._placement_group = None
        self._rank_nodes: list[tuple[str, str]] = []  # (IP, Ray node id) of each rank, for errors
        self._local: RankRuntime | None = None
        init_kwargs = dict(init_kwargs or {})
        from rl_core.cluster.config import worker_env

        env = worker_env()
        env.update(env_vars or {})
        if use_ray:
            threads = torch_threads if torch_threads is not None else max(1, math.ceil(cpus_per_worker))
            try:
                self._start_ray(worker_cls, init_args, init_kwargs, cpus_per_worker, gpus_per_worker, env,
                                threads, startup_timeout_s, pg_timeout_s, placement_strategy, resources)
            except BaseException:
                self.shutdown()  # the caller gets no handle: free the actors and the placement group now
                raise
        else:
            self._start_local(worker_cls, init_args, init_kwargs, env, torch_threads, pg_timeout_s)

    # ----------------------------------------------------------------------------------------- start

    def _start_ray(self, worker_cls, init_args, init_kwargs, cpus, gpus, env, threads, startup_timeout_s,
                   pg_timeout_s, strategy, resources) -> None:
        import ray
        from ray import cloudpickle
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rl_core.cluster.config import group_placement

        if not ray.is_initialized():  # Ray starts once, from the program's cluster config, never with defaults here
            raise RuntimeError(f"worker group {self.name!r} runs on Ray, but Ray is not started: call "
                               "rl_core.cluster.init_ray(cfg.cluster) first (the `rl` commands do)")
        default_strategy, default_resources = group_placement(self.name)
        strategy = strategy or default_strategy
        custom = default_resources if resources is None else dict(resources)
        bundle = {"CPU": cpus} | ({"GPU": gpus} if gpus else {}) | custom
        self._placement_group = placement_group([dict(bundle) for _ in range(self.world_size)], strategy=strategy)
        ready, _ = ray.wait([self._placement_group.ready()], timeout=startup_timeout_s)
        if not ready:
            available = ray.available_resources()
            free = [f"{available.get('CPU', 0):g} CPUs", f"{available.get('GPU', 0):g} GPUs"]
            free += [f"{available.get(name, 0):g} {name!r}" for name in custom]
            self.shutdown()
            raise WorkerError(
                self.name, None, "start",
                f"could not reserve {self.world_size} x {bundle} ({strategy}) within {startup_timeout_s:.0f} s; "
                f"the Ray cluster has {', '.join(free)} free. Give a local Ray more logical CPUs "
                "(cluster.num_cpus), start nodes with the custom resources (`ray start --resources=...`), "
                "or ask for fewer workers/resources.",
            )
        actor_cls = ray.remote(RankRuntime)
        self._actors = [
            actor_cls.options(
                num_cpus=cpus,
                num_gpus=gpus,
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._placement_group, placement_group_bundle_index=rank
                ),
            ).remote()
            for rank in range(self.world_size)
        ]
        infos = self._wait_all([a.node_info.remote() for a in self._actors], "node_info", startup_timeout_s)
        self._rank_nodes = [(ip, node_id) for ip, node_id, _ in infos]
        logger.info("worker group %r: %s", self.name,
                    ", ".join(f"rank {r} on node {ip} ({node[:8]})" for r, (ip, node) in enumerate(self._rank_nodes)))
        master_addr, _, master_port = infos[0]
        local_ranks, local_sizes = _local_ranks([node_id for _, node_id, _ in infos])
        setup = [
            actor.setup.remote(rank, self.world_size, local_ranks[rank], local_sizes[rank], master_addr,
                               master_port, env, threads, pg_timeout_s, ray_actor=True)
            for rank, actor in enumerate(self._actors)
        ]
        self._wait_all(setup, "init_process_group", startup_timeout_s)
        payload = ray.put(cloudpickle.dumps((worker_cls, init_args, init_kwargs)))
        construct = [a.construct_pickled.remote(payload, sys.path) for a in self._actors]
        self._wait_all(construct, f"{worker_cls.__name__}.__init__", self.timeout_s)

    def _start_local(self, worker_cls, init_args, init_kwargs, env, threads, pg_timeout_s) -> None:
        import torch.distributed as dist

        state = _LocalProcessGroup
        if state.users == 0:
            state.saved_env = {}
        for key in (*env, *_RANK_ENV_KEYS):  # restored when the last in-process group shuts down
            state.saved_env.setdefault(key, os.environ.get(key))
        self._local = RankRuntime()
        self._local.setup(0, 1, 0, 1, "127.0.0.1", free_port(), env, threads, pg_timeout_s, init_process_group=False)
        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if _cuda_available() else "gloo"
            store = dist.HashStore()  # world size 1: no rendezvous needed
            dist.init_process_group(backend=backend, store=store, rank=0, world_size=1)
            state.owned = True
        state.users += 1
        try:
            self._local.construct(worker_cls, init_args, init_kwargs)
        except Exception as e:  # noqa: BLE001 - surfaced as WorkerError like on Ray
            failure = RankFailure(e)
            self.shutdown()
            raise WorkerError(self.name, 0, f"{worker_cls.__name__}.__init__", failure.args[0],
                              failure.traceback_text) from e

    # ------------------------------------------------------------------------------------------ calls

    def run_all(self, method: str, *args, **kwargs) -> list:
        """Call ``method(*args, **kwargs)`` on every rank; returns the results in rank order."""
        return self.get(self.run_all_async(method, *args, **kwargs))

    def run_all_per_rank(self, method: str, args_per_rank: list[tuple], kwargs_per_rank: list[dict] | None = None
                         ) -> list:
        """Call ``method`` on every rank with its own arguments (one tuple / dict per rank)."""
        return self.get(self.run_all_per_rank_async(method, args_per_rank, kwargs_per_rank))

    def run_rank(self, rank: int, method: str, *args, **kwargs):
        """Call ``method`` on one rank and return its result."""
        return self.get(self.run_rank_async(rank, method, *args, **kwargs))

    def run_all_async(self, method: str, *args, **kwargs) -> WorkerFutures:
        """Start ``method`` on every rank; resolve with ``get``."""
        return self._submit(method, [(rank, args, kwargs) for rank in range(self.world_size)], single=False)

    def run_all_per_rank_async(self, method: str, args_per_rank: list[tuple],
                               kwargs_per_rank: list[dict] | None = None) -> WorkerFutures:
        if len(args_per_rank) != self.world_size:
            raise ValueError(f"worker group {self.name!r}: {method}() got {len(args_per_rank)} argument tuples "
                             f"for {self.world_size} ranks")
        kwargs_per_rank = kwargs_per_rank if kwargs_per_rank is not None else [{}] * self.world_size
        if len(kwargs_per_rank) != self.world_size:
            raise ValueError(f"worker group {self.name!r}: {method}() got {len(kwargs_per_rank)} kwargs dicts "
                             f"for {self.world_size} ranks")
        calls = [(rank, tuple(a), dict(k)) for rank, (a, k) in enumerate(zip(args_per_rank, kwargs_per_rank))]
        return self._submit(method, calls, single=False)

    def run_rank_async(self, rank: int, method: str, *args, **kwargs) -> WorkerFutures:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"worker group {self.name!r}: rank {rank} out of range [0, {self.world_size})")
        return self._submit(method, [(rank, args, kwargs)], single=True)

    def get(self, futures: WorkerFutures):
        """Wait for the results of an async call: a list in rank order, or one value for ``run_rank_async``."""
        if futures.refs is None:
            if futures.error is not None:
                raise futures.error
            results = futures.results
        else:
            results = self._wait_all(futures.refs, futures.method, self.timeout_s, ranks=futures.ranks)
        return results[0] if futures.single else results

    def _submit(self, method: str, calls: list[tuple[int, tuple, dict]], single: bool) -> WorkerFutures:
        self._check_open(method)
        ranks = [rank for rank, _, _ in calls]
        if self.use_ray:
            refs = [self._actors[rank].call.remote(method, args, kwargs) for rank, args, kwargs in calls]
            return WorkerFutures(method, ranks, refs=refs, single=single)
        (_, args, kwargs), = calls
        try:
            return WorkerFutures(method, ranks, results=[self._local.call(method, args, kwargs)], single=single)
        except Exception as e:  # noqa: BLE001 - surfaced as WorkerError like on Ray
            failure = RankFailure(e)
            error = WorkerError(self.name, 0, method, failure.args[0], failure.traceback_text)
            error.__cause__ = e
            return WorkerFutures(method, ranks, error=error, single=single)

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise WorkerError(self.name, None, method, "the group is shut down")

    # ------------------------------------------------------------------------------------------- wait

    def _wait_all(self, refs: list, method: str, timeout_s: float | None, ranks: list[int] | None = None) -> list:
        """Results of ``refs`` (one per rank in ``ranks``) in order, or WorkerError as soon as one fails."""
        import ray

        ranks = ranks if ranks is not None else list(range(len(refs)))
        rank_of = dict(zip(refs, ranks))
        results: dict[int, Any] = {}
        pending = list(refs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
            for ref in ready:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - any failure of a rank
                    self._raise_failure(method, rank_of, (rank_of[ref], e), pending)
            if pending and deadline is not None and time.monotonic() > deadline:
                self._mark_broken()
                raise WorkerError(self.name, rank_of[pending[0]], method,
                                  f"did not finish within {timeout_s:g} s ({len(pending)} rank(s) still running)",
                                  group_shut_down=True)
        return [results[rank] for rank in ranks]

    def _raise_failure(self, method: str, rank_of: dict, first: tuple[int, Exception], pending: list) -> None:
        """Give the other ranks a grace period, kill the group if it is broken, raise WorkerError."""
        import ray

        failures = [first]
        if pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_GRACE_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as e:  # noqa: BLE001
                    failures.append((rank_of[ref], e))
        died = [f for f in failures if isinstance(f[1], ray.exceptions.RayActorError)]
        broken = bool(died or pending)
        if broken:
            self._mark_broken()
        rank, exc = died[0] if died else failures[0]
        reason, tb, cause = _describe(exc)
        if died and rank < len(self._rank_nodes):
            ip, node_id = self._rank_nodes[rank]
            reason = reason.replace("the worker process died",
                                    f"the worker process on node {ip} (node id {node_id}) died", 1)
        others = [f"rank {r}: {_describe(e)[0].splitlines()[0]}" for r, e in failures if r != rank]
        if others:
            reason += "\nOther ranks failed too: " + "; ".join(others)
        error = WorkerError(self.name, rank, method, reason, tb, group_shut_down=broken)
        raise error from cause

    def _mark_broken(self) -> None:
        self._healthy = False
        self.shutdown()

    # --------------------------------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Destroy the process groups, kill the actors, free the placement group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.use_ray:
            self._shutdown_ray()
        elif self._local is not None:
            self._shutdown_local()

    def _shutdown_ray(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self._healthy and self._actors:
            try:
                ray.wait([a.teardown.remote() for a in self._actors], num_returns=len(self._actors),
                         timeout=_TEARDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the actors are killed next anyway
                logger.debug("teardown of worker group %r failed", self.name, exc_info=True)
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._actors = []
        if self._placement_group is not None:
            try:
                remove_placement_group(self._placement_group)
            except Exception:  # noqa: BLE001 - already removed
                pass

    def _shutdown_local(self) -> None:
        import torch.distributed as dist

        runtime, self._local = self._local, None
        try:
            runtime.teardown()
        finally:
            state = _LocalProcessGroup
            state.users -= 1
            if state.users == 0:
                if state.owned and dist.is_initialized():
                    dist.destroy_process_group()
                state.owned = False
                for key, value in state.saved_env.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __len__(self) -> int:
        return self.world_size

    def __repr__(self) -> str:
        state = "shut down" if self._closed else ("ray" if self.use_ray else "in-process")
        return f"WorkerGroup(name={self.name!r}, world_size={self.world_size}, {state})"


def _local_ranks(node_ids: list[str]) -> tuple[list[int], list[int]]:
    """LOCAL_RANK and LOCAL_WORLD_SIZE of each rank: its index among the ranks on the same node."""
    seen: dict[str, int] = {}
    local = []
    for node in node_ids:
        local.append(seen.get(node, 0))
        seen[node] = local[-1] + 1
    return local, [seen[node] for node in node_ids]


def _describe(exc: Exception) -> tuple[str, str, BaseException | None]:
    """(one-line reason, the worker's traceback, the worker's own exception) of a Ray failure."""
    import ray

    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        reason = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc).splitlines()[0]
        # The exception Ray re-raises is a dual RayTaskError/cause class whose str() is the worker's traceback.
        return f"raised {reason}", _ANSI_COLOR.sub("", str(exc)), cause
    if isinstance(exc, ray.exceptions.RayActorError):
        detail = " ".join(str(exc).split())
        return f"the worker process died ({detail[:600]})", "", None
    return f"{type(exc).__name__}: {exc}", "", exc


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
