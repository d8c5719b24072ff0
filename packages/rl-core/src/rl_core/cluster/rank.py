"""What runs inside each rank of a worker group: environment, torch.distributed, the user's worker.

The same ``RankRuntime`` runs inside a Ray actor (``WorkerGroup(use_ray=True)``) and inside the
driver process (``use_ray=False``), so both paths set up ranks identically.
"""

from __future__ import annotations

import datetime
import os
import socket
import traceback


def free_port() -> int:
    """A TCP port that is free on this machine right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    """This machine's IP as Ray sees it (127.0.0.1-style loopback on a single local node)."""
    try:
        import ray.util

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - Ray missing or not initialised: single machine
        return "127.0.0.1"


class RankFailure(Exception):
    """Carries a worker exception's formatted traceback from a rank to the driver (in-process path)."""

    def __init__(self, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.original = exc
        self.traceback_text = "".join(traceback.format_exception(exc))


class RankRuntime:
    """One rank: sets its environment and threads, joins torch.distributed, builds and calls the worker."""

    def __init__(self):
        self.worker = None
        self.rank = None
        self.owns_process_group = False

    def node_info(self) -> tuple[str, str, int]:
        """(node IP, Ray node id or "local", a free port on this node) used to pick the rendezvous."""
        try:
            import ray

            node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
        except Exception:  # noqa: BLE001
            node_id = "local"
        return node_ip(), node_id, free_port()

    def setup(self, rank: int, world_size: int, local_rank: int, local_world_size: int, master_addr: str,
              master_port: int, env: dict[str, str], torch_threads: int | None, pg_timeout_s: float,
              init_process_group: bool = True) -> str:
        """Export the rank's environment, set torch threads and initialise the default process group.
        Returns the torch.distributed backend used."""
        import torch
        import torch.distributed as dist

        self.rank = rank
        os.environ.update(env)
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(local_world_size),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        if torch_threads is not None:
            # Ray sets OMP_NUM_THREADS=1 in actors; torch would otherwise use one thread.
            torch.set_num_threads(torch_threads)
        use_cuda = torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(0 if "CUDA_VISIBLE_DEVICES" in os.environ else local_rank)
        backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
        if init_process_group and not dist.is_initialized():
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=pg_timeout_s),
            )
            self.owns_process_group = True
        return backend

    def construct(self, worker_cls, args: tuple, kwargs: dict) -> None:
        self.worker = worker_cls(*args, **kwargs)

    def construct_pickled(self, payload: bytes, driver_sys_path: list[str]) -> None:
        """Build the worker from ``cloudpickle.dumps((worker_cls, args, kwargs))``.

        The driver's ``sys.path`` entries are appended first, so a class that the driver could import
        (a test module, a script's neighbour) is importable here too.
        """
        import sys

        from ray import cloudpickle

        sys.path.extend(p for p in driver_sys_path if p not in sys.path)
        worker_cls, args, kwargs = cloudpickle.loads(payload)
        self.construct(worker_cls, args, kwargs)

    def call(self, method: str, args: tuple, kwargs: dict):
        return getattr(self.worker, method)(*args, **kwargs)

    def teardown(self) -> None:
        """Let the worker clean up (its ``shutdown()`` if it has one), then leave torch.distributed."""
        import torch.distributed as dist

        worker, self.worker = self.worker, None
        if worker is not None and callable(getattr(worker, "shutdown", None)):
            worker.shutdown()
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_process_group = False
