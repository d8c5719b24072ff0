"""Where Ray runs: start a local Ray (the default) or join an existing cluster."""

from __future__ import annotations

import logging
import os
from typing import Literal

from pydantic import Field, field_validator

from rl_core.cluster.malloc import ENV_VAR as MALLOC_ENV_VAR
from rl_core.cluster.malloc import MallocMode
from rl_core.config.base import StrictModel

logger = logging.getLogger(__name__)

# Environment variables copied from the driver into every worker when set there.
PASSTHROUGH_ENV_VARS = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "HF_DATASETS_OFFLINE",
    "RL_CACHE_DIR",
    "PYTHONHASHSEED",
    "CUDA_LAUNCH_BLOCKING",
    "NCCL_DEBUG",
    "TORCH_DISTRIBUTED_DEBUG",
)
# The worker groups the commands build, by name (the keys of cluster.group_resources).
WORKER_GROUP_NAMES = ("generation", "policy", "reward_model", "teacher")
# Set in every worker unless the driver or the config says otherwise.
DEFAULT_WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false"}


class ClusterConfig(StrictModel):
    """The Ray cluster the program runs on."""

    address: str | None = None
    """None starts a local Ray inside this program. "auto" joins the cluster started on this machine
    with `ray start`; "host:port" or "ray://host:port" joins a remote one (multi-node, Slurm, KubeRay)."""

    num_cpus: int | None = Field(default=None, gt=0)
    """Logical CPUs of a local Ray (ignored when joining). Placement-group bundles reserve logical CPUs,
    so when actors share cores ask for more than the machine has. None: max(8, 2 x os.cpu_count())."""

    num_gpus: int | None = Field(default=None, ge=0)
    """GPUs of a local Ray (ignored when joining). None: let Ray detect them."""

    namespace: str = "rl"
    """Ray namespace of this program's actors."""

    object_store_memory: int | None = Field(default=None, gt=0)
    """Bytes of shared memory for Ray's object store of a local Ray. None: Ray's default."""

    temp_dir: str | None = None
    """Ray's session directory of a local Ray (logs, sockets). None: Ray's default (/tmp/ray)."""

    log_to_driver: bool = True
    """Forward the workers' stdout/stderr to this program's terminal."""

    env_vars: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for every worker process."""

    malloc: MallocMode = "auto"
    """glibc's malloc in this program and its workers: "retain" keeps large freed blocks for reuse instead
    of returning them to the kernel (CPU training steps allocate vocab-sized tensors for every micro-batch,
    and faulting fresh pages in for each took ~1/4 of the main recipe's training step); the processes keep
    the memory of their peak. "auto": retain in the processes that use no GPU. "system": glibc's defaults.
    Lasts for the life of each process (rl_core.cluster.malloc)."""

    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """How the ranks of each worker group are placed on the nodes: PACK on as few nodes as possible,
    SPREAD over as many as possible (the STRICT_ variants fail rather than fall back)."""

    group_resources: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Custom Ray resources that each rank of a worker group reserves, by group name ("policy",
    "generation", ...). E.g. ``{policy: {trainer: 1}, generation: {rollout: 1}}`` with nodes started as
    ``ray start --resources='{"trainer": 8}'`` keeps training and generation on their own nodes."""

    @field_validator("group_resources")
    @classmethod
    def _custom_resources_only(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for group, resources in value.items():
            if group not in WORKER_GROUP_NAMES:
                raise ValueError(f"unknown worker group {group!r}; the groups are {', '.join(WORKER_GROUP_NAMES)}")
            for name, amount in resources.items():
                if name in ("CPU", "GPU", "memory"):
                    raise ValueError(f"{group}.{name}: CPUs and GPUs per rank are set by the group's own "
                                     "config (cpus_per_worker, gpus_per_worker ...); name a custom resource here")
                if amount <= 0:
                    raise ValueError(f"{group}.{name}: must be > 0, got {amount:g}")
        return value


def default_num_cpus() -> int:
    """Logical CPUs for a local Ray: generous, since they are reservations, not cores."""
    return max(8, 2 * (os.cpu_count() or 1))


# Where worker groups go: the placement of the config last given to init_ray (Ray itself is
# process-global too, and the backends that build the groups do not see the cluster config).
_placement = ClusterConfig()


def use_placement(cfg: ClusterConfig) -> None:
    """Make ``cfg``'s placement strategy, group resources and malloc mode the defaults of new worker groups."""
    global _placement
    _placement = cfg


def group_placement(name: str) -> tuple[str, dict[str, float]]:
    """``(placement strategy, custom resources per rank)`` of the worker group called ``name``."""
    return _placement.placement_strategy, dict(_placement.group_resources.get(name, {}))


def worker_env(cfg: ClusterConfig | None = None) -> dict[str, str]:
    """The environment every worker gets: defaults, the malloc mode (``cfg``'s, else the one last given to
    :func:`use_placement`), then variables passed through from the driver, then the config's ``env_vars``."""
    env = {k: os.environ.get(k, v) for k, v in DEFAULT_WORKER_ENV.items()}
    env[MALLOC_ENV_VAR] = (cfg or _placement).malloc
    env.update({k: os.environ[k] for k in PASSTHROUGH_ENV_VARS if k in os.environ})
    if cfg is not None:
        env.update(cfg.env_vars)
    return env


def init_ray(cfg: ClusterConfig | None = None) -> None:
    """Start or join Ray as ``cfg`` says. Idempotent: does nothing when Ray is already initialised
    in this process (whoever started it), except that ``cfg``'s placement (strategy, group resources)
    becomes the default of the worker groups built from now on. Never starts the dashboard."""
    import ray

    if cfg is not None:
        use_placement(cfg)
    cfg = cfg or ClusterConfig()
    if ray.is_initialized():
        logger.debug("Ray is already initialised; init_ray(%s) does nothing", cfg)
        return
    # Ray would otherwise try to wrap workers in `uv run` when the driver was started by uv.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    kwargs: dict = dict(
        namespace=cfg.namespace,
        include_dashboard=False,
        log_to_driver=cfg.log_to_driver,
        configure_logging=False,
        runtime_env={"env_vars": worker_env(cfg)},
    )
    if cfg.address is None:
        kwargs.update(
            # "local": a fresh Ray of this program's own, never a cluster that happens to run on this
            # machine (a stale `ray start` would otherwise be joined silently).
            address="local",
            num_cpus=cfg.num_cpus or default_num_cpus(),
            num_gpus=cfg.num_gpus,
            object_store_memory=cfg.object_store_memory,
            _temp_dir=cfg.temp_dir,
        )
    else:
        _check_reachable(cfg.address)
        kwargs["address"] = cfg.address
    try:
        ray.init(**kwargs)
    except ConnectionError as e:
        raise ConnectionError(
            f"could not join the Ray cluster at cluster.address={cfg.address!r}: {e}. Start one with "
            "`ray start --head` (or give the right address), or set cluster.address=null to start "
            "a local Ray inside this program."
        ) from e


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at a plain "host:port" address
    (Ray itself keeps retrying for a long time)."""
    import socket

    if address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as e:
        raise ConnectionError(
            f"could not join the Ray cluster at cluster.address={address!r}: nothing answers there ({e}). "
            "Start one with `ray start --head` (or give the right address), or set cluster.address=null "
            "to start a local Ray inside this program."
        ) from e
