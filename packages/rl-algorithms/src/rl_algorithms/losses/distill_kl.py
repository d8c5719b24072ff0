"""Distillation KL over the teacher's top-k tokens (on-policy distillation).

At every trained position t the teacher gives its k most likely tokens (``teacher_topk_indices``
[B, T, k]) and their logits (``teacher_topk_logits`` [B, T, k]; logprobs work the same, since both are
re-normalised over the k tokens with a log-softmax). The student's logits are gathered at those
indices (``needs_logits``) and:

* ``student_full_vocab=False`` (default): soft-maxed over the k tokens too, so both are distributions
  on the same k tokens;
* ``student_full_vocab=True``: the student keeps its full-vocabulary softmax. The forward KL then also
  pushes student mass into the teacher's top-k; the reverse KL gets a tail term for the student mass
  outside the top-k, where the teacher's logprob is taken as ``teacher_tail_logprob`` (as in NeMo RL):
  ``sum_{v not in top-k} q_v (log q_v - teacher_tail_logprob)``.

With p the teacher and q the student on the k tokens::

    forward = sum_k p (log p - log q)     reverse = sum_k q (log q - log p)
    mixed   = forward_weight * forward + (1 - forward_weight) * reverse

Positions and tokens follow rl_core.types: row t scores ``input_ids[t]``; ``loss_mask`` [B, T] selects
the student's generated tokens. Reduced like the policy losses with the global token count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rl_algorithms.losses.masking import Reduction, loss_token_mask, reduce_loss, token_mean_contribution
from rl_core.batch import Batch
from rl_core.types import ModelOutputs, Normalizer

KLType = Literal["forward", "reverse", "mixed"]


def topk_kl(teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, kl_type: KLType,
            forward_weight: float = 0.5, reverse_tail: torch.Tensor | None = None) -> torch.Tensor:
    """KL per position from logprobs on the same k tokens ``[..., k]``; returns ``[...]``.

    ``reverse_tail`` [...] is added to the reverse KL (student mass outside the k tokens).
    """
    forward = reverse = None
    if kl_type in ("forward", "mixed"):
        forward = (teacher_logprobs.exp() * (teacher_logprobs - student_logprobs)).sum(dim=-1)
    if kl_type in ("reverse", "mixed"):
        reverse = (student_logprobs.exp() * (student_logprobs - teacher_logprobs)).sum(dim=-1)
        if reverse_tail is not None:
            reverse = reverse + reverse_tail
    if kl_type == "forward":
        return forward
    if kl_type == "reverse":
        return reverse
    return forward_weight * forward + (1.0 - forward_weight) * reverse


@dataclass
class DistillationKLLoss:
    """Student-teacher KL on the teacher's top-k; a picklable :class:`~rl_core.protocols.LossFn`."""

    kl_type: KLType = "forward"
    """``forward`` KL(teacher || student), ``reverse`` KL(student || teacher), or ``mixed``."""
    forward_weight: float = 0.5
    """Weight of the forward KL in ``mixed`` (the reverse KL gets 1 - forward_weight)."""
    student_full_vocab: bool = False
    """Use the student's full-vocabulary softmax (plus a tail term in the reverse KL) instead of
    re-normalising it over the teacher's top-k."""
    teacher_tail_logprob: float = -100.0
    """The teacher's logprob assumed outside its top-k (only in the reverse tail term)."""
    reduction: Reduction = "token"

    needs_logits = True

    def __post_init__(self) -> None:
        if self.kl_type not in ("forward", "reverse", "mixed"):
            raise ValueError(f"kl_type must be 'forward', 'reverse' or 'mixed', got {self.kl_type!r}")
        if not 0.0 <= self.forward_weight <= 1.0:
            raise ValueError(f"forward_weight must be in [0, 1], got {self.forward_weight}")
        if self.reduction not in ("token", "sequence"):
            raise ValueError(f"reduction must be 'token' or 'sequence', got {self.reduction!r}")

    def __call__(self, outputs: ModelOutputs, batch: Batch, normalizer: Normalizer) -> tuple[torch.Tensor, dict[str, float]]:
        if outputs.logits is None:
            raise ValueError("the distillation loss needs ModelOutputs.logits (needs_logits=True)")
        per_token = self.per_token_kl(outputs.logits, batch["teacher_topk_logits"], batch["teacher_topk_indices"])
        mask = loss_token_mask(batch)
        loss = reduce_loss(per_token, mask, normalizer, self.reduction)
        return loss, {"distill_kl": token_mean_contribution(per_token, mask, normalizer)}

    def per_token_kl(self, student_logits: torch.Tensor, teacher_topk_logits: torch.Tensor,
                     teacher_topk_indices: torch.Tensor) -> torch.Tensor:
        """[B, T] KL from student logits [B, T, V] and the teacher's top-k [B, T, k]."""
        logits = student_logits.float()
        indices = teacher_topk_indices.long()
        teacher_logprobs = torch.log_softmax(teacher_topk_logits.float(), dim=-1)  # [B, T, k]
        tail = None
        if self.student_full_vocab:
            student_all = torch.log_softmax(logits, dim=-1)  # [B, T, V]
            student_logprobs = student_all.gather(-1, indices)  # [B, T, k]
            if self.kl_type != "forward":
                negative_entropy = (student_all.exp() * student_all).sum(dim=-1)  # [B, T]
                topk_part = (student_logprobs.exp() * student_logprobs).sum(dim=-1)
                tail_mass = (1.0 - student_logprobs.exp().sum(dim=-1)).clamp(min=0.0)
                tail = negative_entropy - topk_part - self.teacher_tail_logprob * tail_mass
        else:
            student_logprobs = torch.log_softmax(logits.gather(-1, indices), dim=-1)  # [B, T, k]
        return topk_kl(teacher_logprobs, student_logprobs, self.kl_type, self.forward_weight, tail)
