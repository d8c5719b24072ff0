"""Cross-tokenizer distillation loss: KL between the teacher and the student projected into the teacher's
vocabulary, at aligned positions, plus cross-entropy on the data.

At student position i aligned with teacher position j (both next tokens start at the same character,
see :mod:`rl_algorithms.xtoken.alignment`), the student's full softmax q [V_s] is projected to the
teacher's vocabulary, ``P(v) = sum_{s -> v} q(s)`` (:mod:`rl_algorithms.xtoken.projection` builds the map), read at the
teacher's top-k tokens and re-normalised over them, as is the teacher's top-k. Then::

    L = kl_coef * sum_{aligned} KL_t / N_tokens  +  ce_coef * sum_t -logpi_student,t mask_t / N_tokens

with N_tokens the GLOBAL number of loss tokens (``normalizer.num_valid_tokens``), so micro-batches sum to
the batch loss. Batch keys: ``loss_mask``, ``xtoken_aligned_mask`` [B, T], ``teacher_topk_logits`` and
``teacher_topk_indices`` [B, T, k] (teacher ids, copied to the aligned student positions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_algorithms.losses.distill_kl import KLType, topk_kl
from rl_algorithms.losses.masking import loss_token_mask
from rl_core.batch import Batch
from rl_core.types import ModelOutputs, Normalizer


def project_probs(student_probs: torch.Tensor, student_to_teacher: torch.Tensor, teacher_vocab_size: int) -> torch.Tensor:
    """Sum the student's probability mass into the teacher tokens it maps to (differentiable)."""
    mapping = student_to_teacher.to(student_probs.device)
    vocab = min(student_probs.shape[-1], mapping.shape[0])  # logits may be padded past the tokenizer
    mapped = (mapping[:vocab] >= 0).nonzero(as_tuple=True)[0]
    out = student_probs.new_zeros(*student_probs.shape[:-1], teacher_vocab_size)
    return out.index_add(-1, mapping[mapped], student_probs[..., mapped])


@dataclass
class CrossTokenizerKLLoss:
    """A picklable :class:`~rl_core.protocols.LossFn` for teacher/student pairs with different tokenizers."""

    student_to_teacher: torch.Tensor
    """[V_student] long: the teacher id each student token projects to (-1: none)."""
    teacher_vocab_size: int
    kl_type: KLType = "forward"
    forward_weight: float = 0.5
    """Weight of the forward KL when ``kl_type`` is ``mixed``."""
    kl_coef: float = 1.0
    ce_coef: float = 1.0
    """Weight of the cross-entropy (NLL) on the data tokens."""

    needs_logits = True
    _smallest_prob = 1e-30

    def __post_init__(self) -> None:
        if self.kl_type not in ("forward", "reverse", "mixed"):
            raise ValueError(f"kl_type must be 'forward', 'reverse' or 'mixed', got {self.kl_type!r}")
        if self.kl_coef < 0 or self.ce_coef < 0 or self.kl_coef + self.ce_coef == 0:
            raise ValueError(f"kl_coef and ce_coef must be >= 0 and not both 0, got {self.kl_coef}, {self.ce_coef}")

    def __call__(self, outputs: ModelOutputs, batch: Batch, normalizer: Normalizer) -> tuple[torch.Tensor, dict[str, float]]:
        if outputs.logits is None:
            raise ValueError("the cross-tokenizer loss needs ModelOutputs.logits (needs_logits=True)")
        mask = loss_token_mask(batch)  # [B, T]
        tokens = max(normalizer.num_valid_tokens, 1.0)
        aligned = (batch["xtoken_aligned_mask"].float() * mask).bool()  # [B, T]

        kl = self.aligned_kl(outputs.logits[aligned], batch["teacher_topk_logits"][aligned],
                             batch["teacher_topk_indices"][aligned])  # [N]
        kl_loss = kl.sum() / tokens
        ce_loss = (-outputs.logprobs.float() * mask).sum() / tokens
        loss = self.kl_coef * kl_loss + self.ce_coef * ce_loss
        metrics = {
            "xtoken_kl": float(kl_loss.item()),
            "ce": float(ce_loss.item()),
            "aligned_fraction": float(aligned.sum().item() / tokens),
        }
        return loss, metrics

    def aligned_kl(self, student_logits: torch.Tensor, teacher_topk_logits: torch.Tensor,
                   teacher_topk_indices: torch.Tensor) -> torch.Tensor:
        """KL per aligned position from student logits [N, V_s] and the teacher's top-k [N, k]."""
        indices = teacher_topk_indices.long()
        vocab = max(self.teacher_vocab_size, int(indices.max().item()) + 1 if indices.numel() else 0)
        projected = project_probs(torch.softmax(student_logits.float(), dim=-1), self.student_to_teacher, vocab)
        student_logprobs = torch.log_softmax(projected.gather(-1, indices).clamp(min=self._smallest_prob).log(), dim=-1)
        teacher_logprobs = torch.log_softmax(teacher_topk_logits.float(), dim=-1)
        return topk_kl(teacher_logprobs, student_logprobs, self.kl_type, self.forward_weight)
