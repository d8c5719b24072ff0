"""Pipeline parallelism of the Megatron backend: megatron-core's own schedule over this rank's stage.

``PipelineSchedule.run`` hands a rank's micro-batches to ``get_forward_backward_func()``, which for
``pipeline_parallel_size > 1`` is the non-interleaved 1F1B schedule
(``forward_backward_pipelining_without_interleaving``): stage s runs P - s - 1 warm-up forwards, then
one forward and one backward in turn, then the remaining backwards. Activations ``[t, b, hidden]`` go
to the next stage and their gradients come back over Megatron's pipeline group (p2p; each transfer
sends its shape first, ``variable_seq_lengths``, because micro-batches differ in rows and length).
The same code runs on GPU (nccl) and on CPU (gloo, with ``cpu_shims`` 5).

With ``virtual_pipeline_parallel_size`` V > 1 each rank holds V model chunks (``stages.py``) and
``get_forward_backward_func()`` is the interleaved schedule
(``forward_backward_pipelining_with_interleaving``): micro-batches go through the chunks in groups
of P, so the pipeline bubble shrinks by V; dummies (``worker.py``) pad the number of micro-batches
to a multiple of P, as the schedule requires, and to at least 2 x P (fewer hung on gloo).

Every stage of a pipeline sees the same data shard and plans the same micro-batches (dummies
included), so the stages agree on each micro-batch's shape and mask. The first stage embeds the
tokens, later ones start from the received activation; only the last computes ``ModelOutputs`` and
calls ``on_outputs`` (the loss, or keeping logprobs). The loss goes back to the schedule untouched:
with ``calculate_per_token_loss`` (``families.transformer_config``) Megatron neither divides it by the
number of micro-batches nor by a token count, as our losses are already divided by global counts.
Results live on the last stage; ``from_last_stage`` gives them to every stage.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from rl_backends_train.batching import MicroBatch, pack_rows
from rl_backends_train.megatron.model import MegatronCausalLM, ModelChunks


class PipelineSchedule:
    """Runs micro-batches through the stages of one pipeline (this rank's pipeline group)."""

    def __init__(self, size: int, group, device: torch.device) -> None:
        self.group = group
        self.device = device
        self.last_rank = dist.get_global_rank(group, size - 1)

    def run(self, model: MegatronCausalLM | ModelChunks, micro_batches: list[MicroBatch],
            on_outputs: Callable[[MicroBatch, MegatronCausalLM], torch.Tensor | None], *, forward_only: bool) -> None:
        """Forward (and unless ``forward_only`` backward) of every micro-batch through every stage.

        ``on_outputs(mb, chunk)`` runs in the forward of ``mb`` through the model chunk holding the
        output layer (the last stage's, its last chunk's): it computes the model outputs (calling
        ``chunk``, which continues from the received activation) and returns the loss to
        back-propagate (ignored when ``forward_only``). With several model chunks (virtual pipeline
        stages) megatron-core's interleaved schedule runs them, one data iterator per chunk."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        chunks = model.model_chunks
        by_gpt = {id(chunk.gpt): chunk for chunk in chunks}

        def forward_step(data_iterator, gpt):
            mb = next(data_iterator)
            chunk = by_gpt[id(gpt)]
            if not chunk.stage.last:
                return chunk(**stage_inputs(mb, self.device)).hidden_states, None
            loss = on_outputs(mb, chunk)
            if forward_only:
                # Not None: with MoE layers the schedule reads the output's device (for the auxiliary
                # loss scale) even when nothing is back-propagated.
                return torch.zeros((), device=self.device), None
            return loss, _per_token_loss

        first = micro_batches[0].batch["input_ids"]
        several = len(chunks) > 1
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=[iter(micro_batches) for _ in chunks] if several else iter(micro_batches),
            model=[chunk.gpt for chunk in chunks] if several else chunks[0].gpt,
            num_microbatches=len(micro_batches),
            seq_length=first.shape[1],  # unused with variable_seq_lengths: shapes travel with the tensors
            micro_batch_size=first.shape[0],
            forward_only=forward_only,
        )

    def from_last_stage(self, value):
        """The last stage's ``value`` on every stage of the pipeline: a tensor (same shape and dtype on
        every stage) or a picklable object."""
        if isinstance(value, torch.Tensor):
            buffer = value.to(self.device)
            dist.broadcast(buffer, src=self.last_rank, group=self.group)
            return buffer.to(value.device)
        box = [value]
        dist.broadcast_object_list(box, src=self.last_rank, group=self.group)
        return box[0]


def stage_inputs(mb: MicroBatch, device: torch.device) -> dict[str, torch.Tensor]:
    """The model inputs of ``mb`` as ``forward.run_model`` builds them (a packed micro-batch is one
    ``[1, L]`` row with restarting positions and a block-diagonal mask, or shared prompts); a stage that does not embed
    still needs them for the shapes and the attention mask."""
    if mb.packed:
        ids, position_ids, mask, _ = pack_rows(mb.batch, share_prompts=mb.share_prompts)
        return {"input_ids": ids.to(device), "position_ids": position_ids.to(device), "attention_mask": mask.to(device)}
    return {"input_ids": mb.batch["input_ids"].to(device), "attention_mask": mb.batch["attention_mask"].to(device)}


def _per_token_loss(loss: torch.Tensor):
    """Megatron's loss-function protocol with ``calculate_per_token_loss``: (loss, token count, data).
    The count is unused (no ``finalize_model_grads_func``)."""
    return loss, torch.zeros((), dtype=torch.int, device=loss.device), {}
