"""Where environment steps run (a recipe's ``grpo.env_runner:`` section)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator

from rl_algorithms.rollout.env_runner import EnvRunner, StepRunner
from rl_core.config import StrictModel
from rl_core.protocols import Environment


class EnvRunnerConfig(StrictModel):
    """How environments run while the engine generates other episodes' turns."""

    kind: Literal["thread", "process", "ray"] = "thread"
    """thread: daemon threads of the driver (cheap; right for fast environments and those that wait on
    I/O or subprocesses). process: a forkserver pool of ``num_workers`` processes on this machine
    (CPU-heavy Python graders). ray: ``num_workers`` Ray actors anywhere in the cluster, each with its
    own copy of the environments; an actor whose task hangs past ``timeout_s``, or that dies, is
    replaced at once."""
    num_workers: int | None = Field(None, gt=0)
    """Processes (process) or actors (ray), default 2; not used by thread."""
    cpus_per_worker: float | None = Field(None, gt=0)
    """ray only: logical CPUs each actor reserves, default 1."""
    timeout_s: float = Field(30.0, gt=0)
    """A step not answered this long after it was submitted scores 0 and counts as an environment error."""

    @model_validator(mode="after")
    def _check(self) -> EnvRunnerConfig:
        # Unset (None) rather than "not given", so that a dumped config.yaml loads back as it was.
        if self.kind == "thread" and self.num_workers is not None:
            raise ValueError("grpo.env_runner.num_workers applies to kind 'process' or 'ray'; threads start one "
                             "per task. Set grpo.env_runner.kind or drop num_workers")
        if self.kind != "ray" and self.cpus_per_worker is not None:
            raise ValueError("grpo.env_runner.cpus_per_worker applies to kind 'ray' only")
        return self

    def build(self, environments: Mapping[str, Environment] | Environment) -> StepRunner:
        """A runner for ``environments`` (``kind: ray`` needs Ray running: ``rl_core.cluster.init_ray``)."""
        num_workers = self.num_workers or 2
        if self.kind == "ray":
            from rl_algorithms.rollout.ray_env_runner import RayEnvRunner

            return RayEnvRunner(environments, num_workers, cpus_per_worker=self.cpus_per_worker or 1.0)
        return EnvRunner(environments, num_workers if self.kind == "process" else 0)
