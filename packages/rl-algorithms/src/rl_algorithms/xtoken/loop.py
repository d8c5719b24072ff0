"""Cross-tokenizer off-policy distillation on a fixed text dataset.

One step: texts -> tokenised twice (student, teacher) and aligned by character offsets -> the
teacher's top-k logits on its tokenisation (a frozen TrainingBackend), copied to the aligned student
positions -> one optimizer step of the student on KL(teacher || projected student) + cross-entropy.
Validation evaluates the same loss exactly on held-out texts (the student's full distribution is read
through ``topk_logits`` over its whole vocabulary). See docs/distillation.md for the method.
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.distill.batch import full_logits
from rl_algorithms.loop import Metrics, MetricsSink
from rl_algorithms.losses.xtoken_kl import CrossTokenizerKLLoss
from rl_algorithms.supervised import evaluate_loss, in_chunks, supervised_train
from rl_algorithms.xtoken.batch import XTokenTokenizers, attach_teacher_topk, build_xtoken_batches
from rl_algorithms.xtoken.config import XTokenConfig
from rl_algorithms.xtoken.projection import VocabProjection
from rl_core.batch import Batch
from rl_core.protocols import TrainingBackend
from rl_core.types import ModelOutputs


def xtoken_distill_train(
    cfg: XTokenConfig,
    student: TrainingBackend,
    teacher: TrainingBackend,
    train_texts: Sequence[str],
    tokenizers: XTokenTokenizers,
    projection: VocabProjection,
    *,
    val_texts: Sequence[str] | None = None,
    student_vocab_size: int | None = None,
    logger: MetricsSink | None = None,
    checkpointer: CheckpointManager | None = None,
    seed: int = 0,
) -> list[Metrics]:
    """Distil ``teacher`` into ``student`` across tokenizers for ``cfg.max_steps`` steps.

    ``student_vocab_size`` (the student's logits width) is needed for validation."""
    loss_fn = cfg.loss.build(projection)
    if val_texts and student_vocab_size is None:
        raise ValueError("cross-tokenizer validation needs student_vocab_size (the student's logits width)")

    def make_batch(texts, step, timer):
        with timer.time("teacher"):
            return teacher_scored_batch(teacher, texts, tokenizers, cfg.teacher_top_k), {}

    def validate(step: int) -> Metrics:
        return xtoken_validation(cfg, loss_fn, student, teacher, val_texts, tokenizers, student_vocab_size)

    return supervised_train(cfg, student, train_texts, make_batch, loss_fn, validate=validate if val_texts else None,
                            logger=logger, checkpointer=checkpointer, seed=seed)


def teacher_scored_batch(teacher: TrainingBackend, texts: Sequence[str], tokenizers: XTokenTokenizers, k: int) -> Batch:
    """The student batch of ``texts`` with the teacher's top-k at every aligned position."""
    student_batch, teacher_batch = build_xtoken_batches(texts, tokenizers)
    values, indices = teacher.topk_logits(teacher_batch, k)
    return attach_teacher_topk(student_batch, values, indices)


def xtoken_validation(cfg: XTokenConfig, loss_fn: CrossTokenizerKLLoss, student: TrainingBackend,
                      teacher: TrainingBackend, texts: Sequence[str], tokenizers: XTokenTokenizers,
                      student_vocab_size: int) -> Metrics:
    """The training loss and its parts (``xtoken_kl``, ``ce``) over held-out texts, no gradient."""
    batches = [teacher_scored_batch(teacher, chunk, tokenizers, cfg.teacher_top_k)
               for chunk in in_chunks(texts, cfg.val_batch_size)]

    def outputs_of(batch: Batch) -> ModelOutputs:
        return ModelOutputs(logprobs=student.logprobs(batch).float(),
                            logits=full_logits(student, batch, student_vocab_size, 1.0))

    return evaluate_loss(loss_fn, batches, outputs_of)
