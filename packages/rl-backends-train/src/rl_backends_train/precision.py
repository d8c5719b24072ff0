"""fp32 master weights with low-precision compute, for a model whose layers compute in their
parameters' dtype (the Megatron backend; the DTensor backend gets the same from FSDP2's
``MixedPrecisionPolicy``).

Outside ``MasterWeights.compute()`` every floating parameter holds fp32 values: the optimizer steps
them (its state is fp32 too), and gradient reductions, clipping, checkpoints, refit and export read
fp32. Inside, each parameter's storage is a bf16 copy of its fp32 value, so forward and backward run
in bf16 exactly as with bf16 parameters; every gradient the backward leaves on a parameter is added
at once into an fp32 gradient (micro-batches accumulate in fp32, as FSDP2's fp32 reduce does), and
on leaving, the fp32 storage comes back with the fp32 gradient. With bf16 parameters instead, an
update smaller than half a bf16 step of the weight (8 mantissa bits: ~1.2e-4 at 0.02, far above
AdamW's ~lr per element at lr 1e-6) would be rounded away.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class MasterWeights:
    """Holds ``model``'s floating parameters in fp32 and swaps in ``compute_dtype`` copies for compute."""

    def __init__(self, model: nn.Module, compute_dtype: torch.dtype) -> None:
        self.params = [p for p in model.parameters() if p.is_floating_point()]
        wrong = sorted({str(p.dtype) for p in self.params if p.dtype != torch.float32})
        if wrong:
            raise ValueError(f"master weights must be fp32; the model has {wrong} parameters")
        self.compute_dtype = compute_dtype
        self._grads: dict[int, torch.Tensor] | None = None  # fp32 gradients, while inside compute()
        for p in self.params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._to_fp32_grad)

    @contextlib.contextmanager
    def compute(self):
        """Parameters in ``compute_dtype`` inside; fp32 values (and fp32 gradients) back on leaving."""
        masters = [p.data for p in self.params]
        kept_grads = [p.grad for p in self.params]  # e.g. the last step's, during a logprobs call
        self._grads = {}
        try:
            for p in self.params:
                p.grad = None
                p.data = p.data.to(self.compute_dtype)
            yield
        finally:
            for p, master, kept in zip(self.params, masters, kept_grads):
                p.grad = None
                p.data = master
                p.grad = self._grads.get(id(p), kept)
            self._grads = None

    def _to_fp32_grad(self, param: nn.Parameter) -> None:
        if self._grads is None:  # a backward outside compute(): the parameters are fp32 already
            return
        grad = param.grad.float()  # [param shape], a new fp32 tensor
        param.grad = None
        total = self._grads.get(id(param))
        if total is None:
            self._grads[id(param)] = grad
        else:
            total.add_(grad)
