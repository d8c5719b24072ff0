"""Optimizers (AdamW; Muon + AdamW), warmup/cosine schedules and global-norm gradient clipping."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from rl_backends_train.config import OptimizerConfig, SchedulerConfig

# Parameters Muon must not touch even when 2-D: token embeddings and output heads.
_NOT_MUON = ("embed_tokens", "lm_head", "score", "word_embeddings", "output_layer")
DEFAULT_MUON_LR = 0.02


def build_optimizers(model: nn.Module, cfg: OptimizerConfig) -> list[torch.optim.Optimizer]:
    """One AdamW over the trainable parameters; with ``muon``, Muon over the 2-D hidden weights first."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    adamw_kwargs = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return [torch.optim.AdamW([p for _, p in trainable], **adamw_kwargs)]
    muon = [p for n, p in trainable if p.ndim == 2 and not any(k in n for k in _NOT_MUON)]
    muon_ids = {id(p) for p in muon}
    rest = [p for _, p in trainable if id(p) not in muon_ids]
    optimizers: list[torch.optim.Optimizer] = []
    if muon:
        lr = cfg.muon_lr if cfg.muon_lr is not None else DEFAULT_MUON_LR
        optimizers.append(torch.optim.Muon(muon, lr=lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum))
    if rest:
        optimizers.append(torch.optim.AdamW(rest, **adamw_kwargs))
    return optimizers


def lr_multiplier(step: int, cfg: SchedulerConfig) -> float:
    """Factor on the peak lr at optimizer step ``step`` (0-based): linear warmup, then constant/cosine."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_schedulers(optimizers: list[torch.optim.Optimizer], cfg: SchedulerConfig) -> list[torch.optim.lr_scheduler.LambdaLR]:
    return [torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_multiplier(step, cfg)) for opt in optimizers]


def clip_grad_norm(grads: list[torch.Tensor], weights: list[float], max_norm: float | None,
                   device: torch.device) -> float:
    """Global L2 norm of a gradient spread over all ranks; ``grads`` scaled to ``max_norm`` in place.

    ``grads``: this rank's gradient tensors (plain tensors, or the local shards of DTensors);
    ``weights``: one per tensor, 1 / (the number of ranks holding the same values), 0 for a copy
    counted elsewhere, so that the weighted sums of squares add up over the world to the square of
    the whole gradient's norm. One fused reduction: the local norms in one kernel, one all-reduce of
    one number over the world, one device-to-host sync. Every rank must call it."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    if grads:
        norms = torch.stack([n.to(device, torch.float64) for n in torch._foreach_norm(grads, 2, dtype=torch.float32)])
        total = (norms.square() * torch.tensor(weights, dtype=torch.float64, device=device)).sum()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    norm = math.sqrt(float(total))
    if max_norm is not None and norm > max_norm and grads:
        torch._foreach_mul_(grads, max_norm / (norm + 1e-6))
    return norm
