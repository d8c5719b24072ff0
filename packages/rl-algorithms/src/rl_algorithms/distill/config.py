"""The on-policy distillation loop's config (``distill:`` in recipes)."""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.losses.distill_kl import DistillationKLLoss, KLType
from rl_algorithms.supervised import SupervisedLoopConfig
from rl_core.config import StrictModel
from rl_core.types import SamplingParams


class KLDirectionConfig(StrictModel):
    """Which KL between teacher and student a distillation loss takes."""

    kl_type: KLType = "forward"
    """``forward`` KL(teacher || student), ``reverse`` KL(student || teacher), or ``mixed``."""
    forward_weight: float = Field(0.5, ge=0.0, le=1.0)
    """Weight of the forward KL when ``kl_type`` is ``mixed``."""


class DistillLossConfig(KLDirectionConfig):
    """The top-k distillation KL (``distill.loss``)."""

    student_full_vocab: bool = False
    """Use the student's full-vocabulary softmax (with a tail term in the reverse KL) instead of
    re-normalising it over the teacher's top-k."""
    teacher_tail_logprob: float = -100.0
    """The teacher's logprob assumed outside its top-k (reverse KL tail term only)."""

    def build(self) -> DistillationKLLoss:
        return DistillationKLLoss(kl_type=self.kl_type, forward_weight=self.forward_weight,
                                  student_full_vocab=self.student_full_vocab,
                                  teacher_tail_logprob=self.teacher_tail_logprob)


class DistillConfig(SupervisedLoopConfig):
    """The student samples responses; a frozen teacher scores them with its top-k logits."""

    batch_size: int = Field(8, gt=0)
    """Prompts per optimizer step (one generation round each)."""
    num_generations_per_prompt: int = Field(1, gt=0)
    """Student samples per prompt."""
    max_new_tokens: int = Field(128, gt=0)
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature; the student's and the teacher's logits use the same temperature."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    teacher_top_k: int = Field(64, gt=0)
    """Teacher tokens per position that the KL is computed on."""
    loss: DistillLossConfig = Field(default_factory=DistillLossConfig)
    val_seed: int = 1234
    """Sampling seed of validation: the same held-out samples for a fixed student."""

    def sampling(self, stop_token_ids: tuple[int, ...], seed: int | None) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              n=self.num_generations_per_prompt, stop_token_ids=stop_token_ids, seed=seed)
