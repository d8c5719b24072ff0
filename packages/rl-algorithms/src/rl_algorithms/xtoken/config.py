"""The cross-tokenizer distillation loop's config (``xtoken:`` in recipes)."""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.distill.config import KLDirectionConfig
from rl_algorithms.losses.xtoken_kl import CrossTokenizerKLLoss
from rl_algorithms.supervised import SupervisedLoopConfig
from rl_algorithms.xtoken.projection import VocabProjection


class XTokenLossConfig(KLDirectionConfig):
    """KL(teacher || projected student) plus cross-entropy on the text (``xtoken.loss``)."""

    kl_coef: float = Field(1.0, ge=0.0)
    """Weight of the KL term."""
    ce_coef: float = Field(1.0, ge=0.0)
    """Weight of the student's cross-entropy on the text itself."""

    def build(self, projection: VocabProjection) -> CrossTokenizerKLLoss:
        return CrossTokenizerKLLoss(
            student_to_teacher=projection.student_to_teacher,
            teacher_vocab_size=projection.teacher_vocab_size,
            kl_type=self.kl_type,
            forward_weight=self.forward_weight,
            kl_coef=self.kl_coef,
            ce_coef=self.ce_coef,
        )


class XTokenConfig(SupervisedLoopConfig):
    """Off-policy distillation on fixed texts from a teacher whose tokenizer differs from the student's."""

    batch_size: int = Field(8, gt=0)
    """Texts per optimizer step."""
    teacher_top_k: int = Field(64, gt=0)
    """Teacher tokens per aligned position that the KL is computed on."""
    loss: XTokenLossConfig = Field(default_factory=XTokenLossConfig)
