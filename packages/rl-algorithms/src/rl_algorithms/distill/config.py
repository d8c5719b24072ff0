"""The on-policy distillation loop's config (``distill:`` in recipes)."""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.losses.distill_kl import DistillationKLLoss, KLType
from rl_core.config import StrictModel
from rl_core.types import SamplingParams


class DistillConfig(StrictModel):
    """The student samples responses; a frozen teacher scores them with its top-k logits."""

    max_steps: int = Field(100, gt=0)
    """Optimizer steps (one generation round each)."""
    num_prompts_per_step: int = Field(8, gt=0)
    num_generations_per_prompt: int = Field(1, gt=0)
    """Student samples per prompt."""
    max_new_tokens: int = Field(128, gt=0)
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature; the student's and the teacher's logits use the same temperature."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    topk: int = Field(64, gt=0)
    """Teacher tokens per position that the KL is computed on."""
    kl_type: KLType = "forward"
    """``forward`` KL(teacher || student), ``reverse`` KL(student || teacher), or ``mixed``."""
    forward_weight: float = Field(0.5, ge=0.0, le=1.0)
    """Weight of the forward KL when ``kl_type`` is ``mixed``."""
    student_full_vocab: bool = False
    """Use the student's full-vocabulary softmax (with a tail term in the reverse KL) instead of
    re-normalising it over the teacher's top-k."""
    teacher_tail_logprob: float = -100.0
    """The teacher's logprob assumed outside its top-k (reverse KL tail term only)."""
    val_every: int = Field(0, ge=0)
    """Held-out student-teacher KL every N steps and after the last (0: never)."""
    val_at_start: bool = True
    val_batch_size: int = Field(8, gt=0)
    """Held-out prompts per generation/forward pass during validation."""
    val_seed: int = 1234
    """Sampling seed of validation: the same held-out samples for a fixed student."""

    def build_loss(self) -> DistillationKLLoss:
        return DistillationKLLoss(kl_type=self.kl_type, forward_weight=self.forward_weight,
                                  student_full_vocab=self.student_full_vocab,
                                  teacher_tail_logprob=self.teacher_tail_logprob)

    def sampling(self, stop_token_ids: tuple[int, ...], seed: int | None) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              n=self.num_generations_per_prompt, stop_token_ids=stop_token_ids, seed=seed)
