"""One micro-batch through the model -> ModelOutputs in the padded ``[b, t]`` layout of rl_core.types.

Alignment: ``logprobs[:, t]`` scores ``input_ids[:, t]`` with the logits of position ``t - 1``;
column 0 and padding hold 0. Logits are divided by the temperature before any softmax, in fp32.

With ``loss_tokens_only`` (training), the LM head runs only from the first column any row's
``loss_mask`` covers: the prompt columns before it get no logits (their logprobs and entropy are 0),
which saves the vocab-sized work on them (for GRPO on short answers, most of a sequence is prompt).
Packed micro-batches get the same saving through the packed positions those columns map to (HF
models take them as ``logits_to_keep``; other models compute every logit and index).

A vision-language model also gets the rows' image tensors (``vision.forward_inputs``); packed rows with
images are refused (``vision.check_vision_support`` refuses packing for these models up front).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from rl_backends_train import router_replay, vision
from rl_backends_train.batching import MicroBatch, pack_rows
from rl_backends_train.families import packed_attention_mask
from rl_core.types import ModelOutputs
from rl_core.vision_batch import has_image_rows


def run_model(model: nn.Module, mb: MicroBatch, score_head: nn.Module | None,
              device: torch.device, keep_last: int = 0,
              keep_positions: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Raw ``logits [b, t, V]`` (causal LM) and per-position ``scores [b, t]`` (reward model) of ``mb``.

    ``keep_last > 0`` (causal LM only): logits of the last ``keep_last`` positions only,
    ``[b, keep_last, V]``. Packed micro-batches run as one ``[1, L]`` row and are scattered back to
    ``[b, t]`` (or ``[b, keep_last]``). ``keep_positions``: HF models get the packed positions as
    ``logits_to_keep`` (False: every logit is computed, then indexed; sequence-parallel hidden states
    are DTensors that a plain index tensor cannot select from)."""
    batch = mb.batch
    captured: list[torch.Tensor] = []
    hook = None
    if score_head is not None:
        # The classification head's per-position output, before HF pools it at the last token.
        hook = score_head.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        if mb.packed:
            if has_image_rows(batch):
                raise ValueError("packed micro-batches cannot carry images: set packing.enabled=false")
            ids, position_ids, mask, unpack_index = pack_rows(batch, share_prompts=mb.share_prompts)
            router_replay.set_routing(model, batch, device, packed_index=unpack_index)
            extra = {}
            if keep_last > 0:
                unpack_index = unpack_index[:, unpack_index.shape[1] - keep_last:]
                if keep_positions and isinstance(model, PreTrainedModel):  # LM head only where needed
                    needed = torch.unique(unpack_index)  # sorted
                    extra["logits_to_keep"] = needed.to(device)
                    unpack_index = torch.searchsorted(needed, unpack_index.contiguous())
            position_ids = position_ids.to(device)
            mask = packed_attention_mask(model, mask.to(device), position_ids)
            out = model(input_ids=ids.to(device), position_ids=position_ids, attention_mask=mask, **extra)
            raw = captured[0] if captured else out.logits
            raw = raw[0][unpack_index.to(device)]  # [b, t or keep_last, V or 1]
        else:
            extra = {"logits_to_keep": keep_last} if keep_last > 0 else {}
            extra |= vision.forward_inputs(batch, device)
            router_replay.set_routing(model, batch, device)
            with vision.vision_pass_without_images(model, has_images="pixel_values" in extra):
                out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                            **extra)
            raw = captured[0] if captured else out.logits
    finally:
        if hook is not None:
            hook.remove()
    if score_head is not None:
        return raw, raw[..., 0].float()
    return raw, None


def model_outputs(model: nn.Module, mb: MicroBatch, *, device: torch.device, temperature: float,
                  need_logits: bool, need_entropy: bool, score_head: nn.Module | None = None,
                  loss_tokens_only: bool = False, keep_positions: bool = True) -> ModelOutputs:
    """ModelOutputs of one micro-batch (with autograd when grad is enabled).

    ``loss_tokens_only``: logprobs/entropy only from the first ``loss_mask`` column on (see the
    module docstring); ignored for reward models and when logits are needed."""
    keep_last = 0
    if loss_tokens_only and not (need_logits or score_head is not None):
        keep_last = logits_needed(mb.batch)
    raw, per_position_scores = run_model(model, mb, score_head, device, keep_last, keep_positions)
    batch = mb.batch
    mask = batch["attention_mask"].to(raw.device).bool()
    if per_position_scores is not None:
        last = mask.sum(dim=1) - 1  # [b] index of each sequence's last real token
        scores = per_position_scores.gather(1, last[:, None].clamp(min=0))[:, 0]
        return ModelOutputs(logprobs=torch.zeros(mask.shape, device=raw.device), scores=scores)
    return aligned_outputs(raw, batch["input_ids"].to(raw.device), mask, temperature, need_logits, need_entropy)


def logits_needed(batch) -> int:
    """How many trailing positions need logits so that every ``loss_mask`` token is scored
    (the full width when the batch has no loss mask)."""
    width = batch["input_ids"].shape[1]
    if "loss_mask" not in batch:
        return width
    covered = torch.nonzero(batch["loss_mask"].bool().any(dim=0))
    if covered.numel() == 0:
        return width
    first = int(covered[0, 0])  # token `first` is scored by the logits of position first - 1
    return width - max(first - 1, 0)


def aligned_outputs(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor, temperature: float,
                    need_logits: bool, need_entropy: bool) -> ModelOutputs:
    """Shift ``logits [b, k, V]`` (the last k of t positions) so column j scores token j; logprobs
    and entropy in fp32; columns without logits hold 0."""
    b, k, _ = logits.shape
    t = input_ids.shape[1]
    first = t - k  # position of the first logit; it scores token first + 1
    scaled = logits[:, :-1].float()  # [b, k-1, V] predicts tokens first+1 .. t-1
    if temperature != 1.0:
        scaled = scaled / temperature
    log_norm = torch.logsumexp(scaled, dim=-1)  # [b, k-1]
    token_logits = scaled.gather(-1, input_ids[:, first + 1:, None])[..., 0]
    valid = mask[:, first + 1:]
    lead = scaled.new_zeros(b, first + 1)
    logprobs = torch.cat([lead, torch.where(valid, token_logits - log_norm, 0.0)], dim=1)
    entropy = None
    if need_entropy:
        with torch.no_grad():
            probs = torch.softmax(scaled, dim=-1)
            ent = log_norm - (probs * scaled).sum(-1)
            entropy = torch.cat([lead, torch.where(valid, ent, 0.0)], dim=1)
    aligned_logits = None
    if need_logits:
        if first:
            raise ValueError("aligned logits need the logits of every position")
        aligned_logits = torch.cat([scaled.new_zeros(b, 1, scaled.shape[-1]), scaled], dim=1)
        aligned_logits = aligned_logits * mask[:, :, None]
    return ModelOutputs(logprobs=logprobs, logits=aligned_logits, entropy=entropy)

