"""Context parallelism of the Megatron backend: each rank of a context-parallel group runs a part of
every sequence's positions, with keys and values all-gathered in each attention layer.

megatron-core implements context parallelism only inside Transformer Engine's attention (ring
attention); its local ``DotProductAttention`` refuses ``context_parallel_size > 1``. This backend
builds the local layer spec on CPU and GPU, so it brings its own core attention for it,
``GatheredKVAttention``: the all-gather flavour of context parallelism (as used for Llama 3), exact
for any attention mask, which is what packed rows and shared prompts need.

The split (Megatron's load balancing for causal attention): a micro-batch's width, padded to a
multiple of ``2C``, is cut into ``2C`` chunks and CP rank r takes chunks r and ``2C - 1 - r``. Each
rank embeds its positions, runs every layer on them (RoPE at their own ``position_ids``), and in
attention its queries see the keys and values of all positions, gathered from the ranks in rank
order (``gathered_order``), under the rows of the full attention mask its queries own. The
logits of the ranks are gathered back to the full width in position order.

Gradients: every rank of the group computes the same loss from the same gathered logits, so the
backward of the logits gather keeps this rank's slice (``GatherKeepSlice``); a rank's keys and
values are used by every rank's queries, so the backward of that gather sums the gradient over the
group before taking the slice (``GatherSumSlice``). Parameter gradients are then summed over the
data x context parallel group (``worker``), as every rank's gradient covers its positions only.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist


def split_index(width: int, size: int, rank: int) -> torch.Tensor:
    """Positions of CP rank ``rank`` in a row of ``width`` (a multiple of ``2 * size``): chunks
    ``rank`` and ``2 * size - 1 - rank`` of ``2 * size``."""
    chunk = width // (2 * size)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    second = torch.arange((2 * size - 1 - rank) * chunk, (2 * size - rank) * chunk)
    return torch.cat([first, second])


def gathered_order(width: int, size: int) -> torch.Tensor:
    """Positions in the order an all-gather over the group lays the ranks' parts out."""
    return torch.cat([split_index(width, size, r) for r in range(size)])


class _Gather(torch.autograd.Function):
    """All-gather ``x`` along ``dim`` over ``group`` (ranks in order). Backward: this rank's slice of
    the gradient, summed over the group first when ``sum_grads``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group, sum_grads: bool) -> torch.Tensor:
        ctx.dim, ctx.group, ctx.sum_grads = dim, group, sum_grads
        ctx.rank, ctx.length = dist.get_rank(group), x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.sum_grads:
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(ctx.dim, ctx.rank * ctx.length, ctx.length), None, None, None


def gather_keep_slice(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """For values every rank then uses identically (the logits the loss reads)."""
    return _Gather.apply(x, dim, group, False)


def gather_sum_slice(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """For values each rank uses differently (keys and values seen by each rank's queries)."""
    return _Gather.apply(x, dim, group, True)


def attention_class():
    """``GatheredKVAttention``, a subclass of megatron-core's local ``DotProductAttention`` (made on
    first use: megatron-core is an optional dependency)."""
    global _attention_class
    if _attention_class is None:
        from megatron.core import parallel_state
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        class GatheredKVAttention(DotProductAttention):
            """Megatron's local core attention for ``[s/C]`` local queries over all-gathered keys and
            values ``[s]``; ``attention_mask`` is ``[b, 1, s/C, s]`` (this rank's query rows, key
            columns in ``gathered_order``), built by ``MegatronCausalLM.forward``."""

            def __init__(self, config, *args, cp_comm_type=None, **kwargs) -> None:
                self.cp_group = parallel_state.get_context_parallel_group()
                local = copy.copy(config)  # the parent refuses CP > 1; the math here is per rank
                local.context_parallel_size = 1
                super().__init__(local, *args, **kwargs)

            def forward(self, query, key, value, attention_mask, *args, **kwargs):
                key = gather_sum_slice(key, 0, self.cp_group)  # [s, b, groups, head_dim]
                value = gather_sum_slice(value, 0, self.cp_group)
                return super().forward(query, key, value, attention_mask, *args, **kwargs)

        _attention_class = GatheredKVAttention
    return _attention_class


_attention_class = None
