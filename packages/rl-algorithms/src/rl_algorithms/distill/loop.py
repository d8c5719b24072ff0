"""On-policy distillation: the student samples, the frozen teacher scores, the student moves towards it.

One step: prompts -> student samples (generation backend) -> the teacher's top-k logits on those
sequences (a second TrainingBackend that is never trained) -> one optimizer step of the student on the
top-k KL -> refit the student's weights into the generation backend.

Validation samples the held-out prompts with a fixed seed and evaluates the same KL exactly: the
student's full distribution is read through ``topk_logits`` over the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_algorithms.checkpointing import CheckpointManager
from rl_algorithms.distill.batch import add_teacher_topk, full_logits, generate_batch
from rl_algorithms.distill.config import DistillConfig
from rl_algorithms.loop import Metrics, MetricsSink, step_seed
from rl_algorithms.losses.distill_kl import DistillationKLLoss
from rl_algorithms.losses.masking import loss_token_mask
from rl_algorithms.supervised import evaluate_loss, in_chunks, supervised_train
from rl_core.batch import Batch
from rl_core.protocols import GenerationBackend, TrainingBackend
from rl_core.types import ModelOutputs, Normalizer


def distill_train(
    cfg: DistillConfig,
    student: TrainingBackend,
    teacher: TrainingBackend,
    generation: GenerationBackend,
    train_prompts: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    stop_token_ids: tuple[int, ...] = (),
    val_prompts: Sequence[Sequence[int]] | None = None,
    vocab_size: int | None = None,
    logger: MetricsSink | None = None,
    checkpointer: CheckpointManager | None = None,
    seed: int = 0,
) -> list[Metrics]:
    """Distil ``teacher`` into ``student`` for ``cfg.max_steps`` steps; returns every step's metrics.

    ``generation`` must hold the student's current weights; ``vocab_size`` (the models' logits width)
    is needed for validation."""
    loss_fn = cfg.loss.build()
    if val_prompts and vocab_size is None:
        raise ValueError("distillation validation needs vocab_size (the models' logits width)")

    def make_batch(prompts, step, timer):
        with timer.time("generate"):
            batch = generate_batch(generation, prompts, cfg.sampling(stop_token_ids, step_seed(seed, step)), pad_token_id)
        metrics = {"response_length_mean": float(batch["response_lengths"].float().mean())}
        with timer.time("teacher"):
            add_teacher_topk(teacher, batch, cfg.teacher_top_k, cfg.temperature)
        return batch, metrics

    def validate(step: int) -> Metrics:
        return distill_validation(cfg, loss_fn, student, teacher, generation, val_prompts, pad_token_id,
                                  stop_token_ids, vocab_size)

    return supervised_train(cfg, student, train_prompts, make_batch, loss_fn,
                            validate=validate if val_prompts else None, logger=logger, checkpointer=checkpointer,
                            seed=seed, generation=generation, temperature=cfg.temperature)


def distill_validation(cfg: DistillConfig, loss_fn: DistillationKLLoss, student: TrainingBackend,
                       teacher: TrainingBackend, generation: GenerationBackend, prompts: Sequence[Sequence[int]],
                       pad_token_id: int, stop_token_ids: tuple[int, ...], vocab_size: int) -> Metrics:
    """The top-k KL (the training objective) on student samples of held-out prompts, fixed seed."""
    sampling = cfg.sampling(stop_token_ids, cfg.val_seed)
    batches = []
    for chunk in in_chunks(prompts, cfg.val_batch_size):
        batch = generate_batch(generation, chunk, sampling, pad_token_id)
        add_teacher_topk(teacher, batch, cfg.teacher_top_k, cfg.temperature)
        batches.append(batch)
    num_rows = sum(b["input_ids"].shape[0] for b in batches)

    def outputs_of(batch: Batch) -> ModelOutputs:
        logits = full_logits(student, batch, vocab_size, cfg.temperature)
        return ModelOutputs(logprobs=torch.zeros(logits.shape[:2]), logits=logits)

    def teacher_fit(batch: Batch, normalizer: Normalizer) -> Metrics:
        # Mean per-token logprob of the student's own samples under the teacher (higher: closer).
        teacher_logprobs = teacher.logprobs(batch, temperature=cfg.temperature, loss_tokens_only=True)
        return {"teacher_logprob": float((teacher_logprobs * loss_token_mask(batch)).sum() / normalizer.num_valid_tokens),
                "response_length_mean": float(batch["response_lengths"].sum()) / num_rows}

    return evaluate_loss(loss_fn, batches, outputs_of, extra=teacher_fit)
