"""One micro-batch through the model -> ModelOutputs in the padded ``[b, t]`` layout of rl_core.types.

Alignment: ``logprobs[:, t]`` scores ``input_ids[:, t]`` with the logits of position ``t - 1``;
column 0 and padding hold 0. Logits are divided by the temperature before any softmax, in fp32.
"""

from __future__ import annotations

import torch
from torch import nn

from rl_backends_train.batching import MicroBatch, pack_rows
from rl_core.types import ModelOutputs


def run_model(model: nn.Module, mb: MicroBatch, score_head: nn.Module | None,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Raw ``logits [b, t, V]`` (causal LM) and per-position ``scores [b, t]`` (reward model) of ``mb``.

    Packed micro-batches run as one ``[1, L]`` row and are scattered back to ``[b, t]``."""
    batch = mb.batch
    captured: list[torch.Tensor] = []
    hook = None
    if score_head is not None:
        # The classification head's per-position output, before HF pools it at the last token.
        hook = score_head.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        if mb.packed:
            ids, position_ids, mask, unpack_index = pack_rows(batch)
            out = model(input_ids=ids.to(device), position_ids=position_ids.to(device), attention_mask=mask.to(device))
            raw = captured[0] if captured else out.logits
            raw = raw[0][unpack_index.to(device)]  # [b, t, V or 1]
        else:
            out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
            raw = captured[0] if captured else out.logits
    finally:
        if hook is not None:
            hook.remove()
    if score_head is not None:
        return raw, raw[..., 0].float()
    return raw, None


def model_outputs(model: nn.Module, mb: MicroBatch, *, device: torch.device, temperature: float,
                  need_logits: bool, need_entropy: bool, score_head: nn.Module | None = None) -> ModelOutputs:
    """ModelOutputs of one micro-batch (with autograd when grad is enabled)."""
    raw, per_position_scores = run_model(model, mb, score_head, device)
    batch = mb.batch
    mask = batch["attention_mask"].to(raw.device).bool()
    if per_position_scores is not None:
        last = mask.sum(dim=1) - 1  # [b] index of each sequence's last real token
        scores = per_position_scores.gather(1, last[:, None].clamp(min=0))[:, 0]
        return ModelOutputs(logprobs=torch.zeros(mask.shape, device=raw.device), scores=scores)
    return aligned_outputs(raw, batch["input_ids"].to(raw.device), mask, temperature, need_logits, need_entropy)


def aligned_outputs(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor, temperature: float,
                    need_logits: bool, need_entropy: bool) -> ModelOutputs:
    """Shift ``logits [b, t, V]`` so row t scores token t; logprobs and entropy in fp32."""
    b, t, _ = logits.shape
    scaled = logits[:, :-1].float() / temperature  # [b, t-1, V] predicts tokens 1..t-1
    log_norm = torch.logsumexp(scaled, dim=-1)  # [b, t-1]
    token_logits = scaled.gather(-1, input_ids[:, 1:, None])[..., 0]
    valid = mask[:, 1:]
    zero_col = scaled.new_zeros(b, 1)
    logprobs = torch.cat([zero_col, torch.where(valid, token_logits - log_norm, 0.0)], dim=1)
    entropy = None
    if need_entropy:
        with torch.no_grad():
            probs = torch.softmax(scaled, dim=-1)
            ent = log_norm - (probs * scaled).sum(-1)
            entropy = torch.cat([zero_col, torch.where(valid, ent, 0.0)], dim=1)
    aligned_logits = None
    if need_logits:
        aligned_logits = torch.cat([scaled.new_zeros(b, 1, scaled.shape[-1]), scaled], dim=1)
        aligned_logits = aligned_logits * mask[:, :, None]
    return ModelOutputs(logprobs=logprobs, logits=aligned_logits, entropy=entropy)

