"""One rank of the DTensor backend: an FSDP2 (+ tensor parallel) shard of an HF model.

Ranks form a ("dp", "tp") mesh; the batch is split over "dp", the ranks of one "tp" group see the
same rows. The operations are ``TrainWorker``'s (``rl_backends_train/worker.py``); this module says
how the model is built and sharded, how full weights are gathered and what DCP saves.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from rl_backends_train.dtensor.parallelize import build_mesh, build_parallel_model
from rl_backends_train.lora import is_adapter_name, lora_modules, set_adapters_enabled
from rl_backends_train.worker import TrainWorker


class DTensorWorker(TrainWorker):
    """Holds one rank's shard; built by rl_core.cluster.WorkerGroup after torch.distributed is up."""

    def _init_parallel(self, seed: int) -> None:
        self.mesh = build_mesh(self.cfg, self.device.type)
        self.dp_group = self.mesh["dp"].get_group()
        self.dp_rank = self.mesh["dp"].get_local_rank()

    def _build_model(self, seed: int) -> nn.Module:
        return build_parallel_model(self.model_path, self.cfg, self.mesh, on_gpu=self.on_gpu)

    def _build_reference(self) -> nn.Module:
        return build_parallel_model(self.model_path, self.cfg, self.mesh, on_gpu=self.on_gpu, trainable=False).eval()

    def _hf_model_class(self) -> type:
        """The HF class of a model that FSDP2 has re-classed as ``FSDP<Name>(FSDPModule, <Name>)``."""
        from torch.distributed.fsdp import FSDPModule

        return next(c for c in type(self.model).__mro__ if not issubclass(c, FSDPModule))

    # ------------------------------------------------------------------------------------- weights

    def _weight_sizes(self) -> Iterator[tuple[str, int]]:
        for name, tensor in self.model.state_dict().items():
            if not is_adapter_name(name):
                yield name, tensor.numel() * tensor.element_size()

    def gather_weights(self, names: list[str]) -> dict[str, torch.Tensor] | None:
        state = self.model.state_dict()
        modules = lora_modules(self.model)
        out = {}
        for name in names:
            tensor = _full(state[name])
            owner = name.rsplit(".", 1)[0]
            if owner in modules and name.endswith(".weight"):
                a, b = _full(state[f"{owner}.lora_A.weight"]), _full(state[f"{owner}.lora_B.weight"])
                tensor = modules[owner].merged_weight(tensor, a, b)
            if self.rank == 0:
                out[name] = tensor.detach().cpu()
        return out if self.rank == 0 else None

    def _adapter_tensors(self) -> dict[str, torch.Tensor] | None:
        adapters = {n: _full(t).detach().cpu() for n, t in self.model.state_dict().items() if is_adapter_name(n)}
        return adapters if self.rank == 0 else None

    @contextlib.contextmanager
    def _adapters_disabled(self):
        set_adapters_enabled(self.model, False)
        try:
            yield
        finally:
            set_adapters_enabled(self.model, True)

    # ------------------------------------------------------------------------ gradients, checkpoints

    def _reduce_gradients(self) -> None:
        """FSDP2 reduce-scatters gradients over "dp" during backward. A tensor-parallel gradient that
        DTensor left Partial (a pending sum over "tp") is summed into its parameter's layout here,
        once, rather than by every optimizer op that reads it."""
        for param in self.trainable:
            grad = param.grad
            if isinstance(grad, DTensor) and any(p.is_partial() for p in grad.placements):
                param.grad = grad.redistribute(grad.device_mesh, param.placements)

    def _weighted_gradients(self) -> tuple[list[torch.Tensor], list[float]]:
        pairs = [local_shard_and_weight(p.grad) for p in self.trainable if p.grad is not None]
        return [g for g, _ in pairs], [w for _, w in pairs]

    def _checkpoint_state(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizers)
        return {"model": model_sd, "optimizer": optim_sd}

    def _restore_checkpoint_state(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizers, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def local_shard_and_weight(grad: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A gradient's local values and 1 / (ranks holding the same values). A DTensor's shard is held by
    the ranks that agree on its mesh coordinates where it is sharded: world / (product of those
    dimensions' sizes) of them. A plain tensor (no FSDP, not split by TP) is the same on every rank."""
    shards = 1
    if isinstance(grad, DTensor):
        if any(p.is_partial() for p in grad.placements):
            raise RuntimeError("gradient norm of a Partial DTensor gradient: reduce it first (_reduce_gradients)")
        shards = math.prod(grad.device_mesh.size(i) for i, p in enumerate(grad.placements) if p.is_shard())
        grad = grad.to_local()
    return grad, shards / dist.get_world_size()


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
