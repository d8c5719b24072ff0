"""What runs inside each rank of a worker group: environment, torch.distributed, the user's worker.

The same ``RankRuntime`` runs inside a Ray actor (``WorkerGroup(use_ray=True)``) and inside the
driver process (``use_ray=False``), so both paths set up ranks identically.
"""

from __future__ import annotations

import datetime
import os
import socket
import traceback

from rl_core.cluster import malloc


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


def cuda_device_index(*, cuda_available: bool, assigned_gpus: list[str] | None, visible_devices: str | None,
                      local_rank: int) -> int | None:
    """The CUDA device a rank uses (an index among the devices this process sees), or None: the CPU.

    ``assigned_gpus``: the GPU ids Ray assigned to the rank's actor (``ray.get_runtime_context()
    .get_accelerator_ids()["GPU"]``), None outside Ray (an in-process rank: device ``local_rank``).
    ``visible_devices``: the process's CUDA_VISIBLE_DEVICES. Ray sets it to the assigned ids when a
    GPU is assigned, but leaves it untouched when none is (Ray 2.60, ``gpus_per_worker: 0``): every
    such rank would see all GPUs and pick device 0, so a rank that sees CUDA without a GPU of its own
    is refused rather than put on a GPU that someone else reserved."""
    if not cuda_available:
        return None
    if assigned_gpus is None:
        return local_rank
    if not assigned_gpus:
        raise RuntimeError(
            "this rank sees CUDA devices but Ray assigned it no GPU (gpus_per_worker=0), so it would use a GPU "
            "it did not reserve: give each rank a GPU (gpus_per_worker=1), or hide the GPUs "
            "(CUDA_VISIBLE_DEVICES=) to run the group on CPU")
    gpu = sorted(str(g) for g in assigned_gpus)[0]
    if visible_devices is None:
        return int(gpu)
    visible = [v.strip() for v in visible_devices.split(",") if v.strip()]
    if gpu not in visible:
        raise RuntimeError(f"Ray assigned GPU {gpu} but CUDA_VISIBLE_DEVICES={visible_devices!r} does not list it")
    return visible.index(gpu)


def ray_assigned_gpus() -> list[str]:
    """The GPU ids Ray assigned to this actor (inside a Ray actor only)."""
    import ray

    return [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]


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
              init_process_group: bool = True, ray_actor: bool = False) -> str:
        """Export the rank's environment, set torch threads, pick the CUDA device (from Ray's assigned
        GPUs in a Ray actor: ``cuda_device_index``), set malloc as ``cluster.malloc`` says and initialise the default process group. Returns
        the torch.distributed backend used."""
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
        device = cuda_device_index(cuda_available=torch.cuda.is_available(),
                                   assigned_gpus=ray_assigned_gpus() if ray_actor else None,
                                   visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), local_rank=local_rank)
        use_cuda = device is not None
        if use_cuda:
            torch.cuda.set_device(device)
        malloc.apply(os.environ.get(malloc.ENV_VAR, "system"), on_gpu=use_cuda)
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
