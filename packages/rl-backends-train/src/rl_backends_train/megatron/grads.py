"""Gradients of the Megatron backend after backward: sums over data parallel and over the two copies
of tied embeddings, and which ranks hold each gradient (for the global norm, ``optim.clip_grad_norm``).

Megatron's TP layers already did the tensor-parallel reductions inside backward. (Megatron's own
``finalize_model_grads`` does the same sums on its DDP wrapper's ``main_grad`` buffers; this backend
trains plain parameters, so it sums ``.grad`` itself.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rl_backends_train.megatron import experts, tp_shards
from rl_backends_train.megatron.model import MegatronCausalLM


def reduce_gradients(model: MegatronCausalLM, trainable: list[torch.nn.Parameter], dp_group,
                     expert_dp_group=None, tp_group=None) -> None:
    """Sum each gradient over the data-parallel ranks (``dp_group``: data x context parallel; an
    expert's over ``expert_dp_group``, the ranks holding the same experts); with tied embeddings split over pipeline
    stages, sum the gradients of the first stage's embedding and the last stage's copy over
    Megatron's embedding group, so both copies take the same step (as one shared tensor would)."""
    # Sequence parallel: a norm weight's gradient covers this rank's positions only; q/k norms (Qwen3)
    # are replicated but each TP rank normalises its own heads: sum both over TP.
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        for param in _partial_over_tp(model):
            if param.requires_grad and param.grad is not None:
                dist.all_reduce(param.grad, group=tp_group)
    expert_params = {id(p) for chunk in model.model_chunks for name, p in chunk.gpt.named_parameters()
                     if experts.is_expert(name)}
    for param in trainable:
        group = expert_dp_group if id(param) in expert_params else dp_group
        if param.grad is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(param.grad, group=group)
    for chunk in model.model_chunks:  # of a rank's chunks, at most one is first or last
        stage = chunk.stage
        if stage.tied_embeddings and stage.size > 1 and (stage.first or stage.last):
            from megatron.core import parallel_state

            weight = chunk.gpt.embedding.word_embeddings.weight if stage.first else chunk.gpt.output_layer.weight
            if weight.requires_grad:  # frozen under LoRA, on both stages alike
                if weight.grad is None:
                    weight.grad = torch.zeros_like(weight)
                dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())


def _partial_over_tp(model: MegatronCausalLM) -> list[torch.nn.Parameter]:
    """Replicated parameters whose gradient on one tensor-parallel rank is a part of the whole."""
    return [p for chunk in model.model_chunks for name, p in chunk.gpt.named_parameters()
            if getattr(p, "sequence_parallel", False) or ".q_layernorm." in name or ".k_layernorm." in name]


def weighted_gradients(model: MegatronCausalLM, dp_group, tp_group, ep_group=None, expert_dp_group=None
                       ) -> tuple[list[torch.Tensor], list[float]]:
    """This rank's gradients and for each 1 / (ranks holding the same values) (``optim.clip_grad_norm``):
    a tensor-parallel shard is held by the data x context parallel ranks (``dp_group``) of its stage,
    a replicated parameter (norms; the same gradient on every TP rank) by those times the TP ranks, an
    expert (with expert parallel) by the ranks holding the same experts (``expert_dp_group``); the last
    stage's copy of tied embeddings counts 0 (the first stage counts that tensor)."""
    dp, tp = dist.get_world_size(dp_group), dist.get_world_size(tp_group)
    grads, weights = [], []
    for chunk in model.model_chunks:
        for name, param in chunk.gpt.named_parameters():
            if param.grad is None:
                continue
            grads.append(param.grad)
            if chunk.stage.holds_tied_copy and name == "output_layer.weight":
                weights.append(0.0)
            elif ep_group is not None and experts.is_expert(name):
                weights.append(1.0 / dist.get_world_size(expert_dp_group))
            elif tp_shards.shard_dim(name) is None:
                weights.append(1.0 / (dp * tp))
            else:
                weights.append(1.0 / dp)
    return grads, weights
