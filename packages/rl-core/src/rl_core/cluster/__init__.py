"""Ray cluster start-up and worker groups with torch.distributed set up in every rank."""

from rl_core.cluster.config import ClusterConfig, default_num_cpus, init_ray, worker_env
from rl_core.cluster.errors import WorkerError
from rl_core.cluster.worker_group import WorkerFutures, WorkerGroup

__all__ = ["ClusterConfig", "WorkerError", "WorkerFutures", "WorkerGroup", "default_num_cpus", "init_ray",
           "worker_env"]
