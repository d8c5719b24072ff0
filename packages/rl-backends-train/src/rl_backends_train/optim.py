"""Optimizers (AdamW; Muon + AdamW), warmup/cosine schedules and global-norm gradient clipping."""

from __future__ import annotations

import math

import torch
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


def clip_grad_norm(params: list[nn.Parameter], max_norm: float | None) -> float:
    """Global L2 norm of all gradients (sharded DTensors included); scale them to ``max_norm``.

    Each DTensor's squared norm is made full separately because parameters may live on different
    meshes (FSDP-only vs FSDP x TP), which torch's foreach clipping cannot mix."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total_sq = torch.zeros((), dtype=torch.float64)
    for g in grads:
        sq = g.detach().float().pow(2).sum()
        if hasattr(sq, "full_tensor"):
            sq = sq.full_tensor()
        total_sq += sq.double().cpu()
    total = math.sqrt(float(total_sq))
    if max_norm is not None and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for g in grads:
            g.mul_(coef)
    return total
