"""Cross-tokenizer off-policy distillation: alignment by character offsets and a vocabulary projection.

See docs/distillation.md for the method. The loss is :class:`rl_algorithms.losses.xtoken_kl.CrossTokenizerKLLoss`
and the loop :func:`rl_algorithms.xtoken.loop.xtoken_distill_train`.
"""

from rl_algorithms.xtoken.alignment import Tokenized, align_positions, tokenize_with_char_starts
from rl_algorithms.xtoken.batch import XTokenTokenizers, attach_teacher_topk, build_xtoken_batches
from rl_algorithms.xtoken.projection import VocabProjection, build_vocab_projection, project_probs
from rl_algorithms.xtoken.token_bytes import token_bytes_table

__all__ = [
    "Tokenized",
    "VocabProjection",
    "XTokenTokenizers",
    "align_positions",
    "attach_teacher_topk",
    "build_vocab_projection",
    "build_xtoken_batches",
    "project_probs",
    "token_bytes_table",
    "tokenize_with_char_starts",
]

from rl_algorithms.xtoken.config import XTokenConfig  # noqa: E402
from rl_algorithms.xtoken.loop import teacher_scored_batch, xtoken_distill_train, xtoken_validation  # noqa: E402

__all__ += ["XTokenConfig", "teacher_scored_batch", "xtoken_distill_train", "xtoken_validation"]
