"""The cross-tokenizer distillation loop's config (``xtoken:`` in recipes)."""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.losses.distill_kl import KLType
from rl_algorithms.losses.xtoken_kl import CrossTokenizerKLLoss
from rl_algorithms.xtoken.projection import VocabProjection
from rl_core.config import StrictModel


class XTokenConfig(StrictModel):
    """Off-policy distillation on fixed texts from a teacher whose tokenizer differs from the student's."""

    max_steps: int = Field(100, gt=0)
    """Optimizer steps."""
    texts_per_step: int = Field(8, gt=0)
    """Texts per optimizer step."""
    topk: int = Field(64, gt=0)
    """Teacher tokens per aligned position that the KL is computed on."""
    kl_type: KLType = "forward"
    """``forward`` KL(teacher || projected student), ``reverse``, or ``mixed``."""
    forward_weight: float = Field(0.5, ge=0.0, le=1.0)
    """Weight of the forward KL when ``kl_type`` is ``mixed``."""
    kl_coef: float = Field(1.0, ge=0.0)
    """Weight of the KL term."""
    ce_coef: float = Field(1.0, ge=0.0)
    """Weight of the student's cross-entropy on the text itself."""
    shuffle: bool = True
    val_every: int = Field(0, ge=0)
    """Held-out KL and cross-entropy every N steps and after the last (0: never)."""
    val_at_start: bool = True
    val_batch_size: int = Field(8, gt=0)

    def build_loss(self, projection: VocabProjection) -> CrossTokenizerKLLoss:
        return CrossTokenizerKLLoss(
            student_to_teacher=projection.student_to_teacher,
            teacher_vocab_size=projection.teacher_vocab_size,
            kl_type=self.kl_type,
            forward_weight=self.forward_weight,
            kl_coef=self.kl_coef,
            ce_coef=self.ce_coef,
        )
