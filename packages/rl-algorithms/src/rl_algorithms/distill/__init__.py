"""On-policy distillation from a frozen teacher that shares the student's tokenizer."""

from rl_algorithms.distill.batch import add_teacher_topk, completions_to_batch, full_logits, generate_batch
from rl_algorithms.distill.config import DistillConfig
from rl_algorithms.distill.loop import distill_train, distill_validation

__all__ = [
    "DistillConfig",
    "add_teacher_topk",
    "completions_to_batch",
    "distill_train",
    "distill_validation",
    "full_logits",
    "generate_batch",
]
