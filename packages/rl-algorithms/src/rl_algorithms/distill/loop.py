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
from rl_algorithms.data.sampler import EpochSampler
from rl_algorithms.distill.batch import add_teacher_topk, full_logits, generate_batch
from rl_algorithms.distill.config import DistillConfig
from rl_algorithms.loop_helpers import (
    Metrics,
    MetricsSink,
    in_chunks,
    maybe_checkpoint,
    maybe_resume,
    normalizer_of,
    prefixed,
    record,
    refit,
    run_validation,
    step_seed,
    timed,
    validation_due,
)
from rl_algorithms.losses.distill_kl import DistillationKLLoss
from rl_algorithms.losses.masking import loss_token_mask
from rl_core.protocols import GenerationBackend, TrainingBackend
from rl_core.types import ModelOutputs


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
    loss_fn = cfg.build_loss()
    sampler = EpochSampler(len(train_prompts), cfg.num_prompts_per_step, seed=seed)
    validate = None
    if val_prompts:
        if vocab_size is None:
            raise ValueError("distillation validation needs vocab_size (the models' logits width)")
        def validate() -> Metrics:
            return distill_validation(cfg, loss_fn, student, teacher, generation, val_prompts, pad_token_id,
                                      stop_token_ids, vocab_size)
    start_step, history = maybe_resume(checkpointer, student, sampler)
    if start_step > 0:
        refit(student, generation)
    if start_step == 0 and validate is not None and cfg.val_every > 0 and cfg.val_at_start:
        history.append(record(logger, {"step": 0.0, **prefixed("val/", validate())}, 0))

    for step in range(start_step, cfg.max_steps):
        metrics: Metrics = {}
        prompts = [train_prompts[i] for i in sampler.next_batch()]
        with timed(metrics, "generate"):
            batch = generate_batch(generation, prompts, cfg.sampling(stop_token_ids, step_seed(seed, step)), pad_token_id)
        metrics["response_length_mean"] = float(batch["response_lengths"].float().mean())
        with timed(metrics, "teacher"):
            add_teacher_topk(teacher, batch, cfg.topk, cfg.temperature)
        with timed(metrics, "train"):
            metrics.update(prefixed("train/", student.train(batch, loss_fn, temperature=cfg.temperature)))
        with timed(metrics, "refit"):
            refit(student, generation)
        done = step + 1
        last = done == cfg.max_steps
        if validation_due(cfg.val_every, done, last):
            run_validation(validate, metrics)
        metrics.update(step=float(done), epoch=float(sampler.epoch))
        history.append(record(logger, metrics, done))
        maybe_checkpoint(checkpointer, done, last, student, sampler, history)
    return history


def distill_validation(cfg: DistillConfig, loss_fn: DistillationKLLoss, student: TrainingBackend,
                       teacher: TrainingBackend, generation: GenerationBackend, prompts: Sequence[Sequence[int]],
                       pad_token_id: int, stop_token_ids: tuple[int, ...], vocab_size: int) -> Metrics:
    """The top-k KL (the training objective) on student samples of held-out prompts, fixed seed."""
    sampling = cfg.sampling(stop_token_ids, cfg.val_seed)
    batches = []
    for chunk in in_chunks(prompts, cfg.val_batch_size):
        batch = generate_batch(generation, chunk, sampling, pad_token_id)
        add_teacher_topk(teacher, batch, cfg.topk, cfg.temperature)
        batches.append(batch)
    normalizer = normalizer_of(batches)
    num_rows = sum(b["input_ids"].shape[0] for b in batches)
    totals: Metrics = {"response_length_mean": 0.0}
    for batch in batches:
        logits = full_logits(student, batch, vocab_size, cfg.temperature)
        outputs = ModelOutputs(logprobs=torch.zeros(logits.shape[:2]), logits=logits)
        loss, metrics = loss_fn(outputs, batch, normalizer)
        totals["loss"] = totals.get("loss", 0.0) + float(loss)
        for key, value in metrics.items():
            totals[key] = totals.get(key, 0.0) + value
        # Mean per-token logprob of the student's own samples under the teacher (higher: closer).
        teacher_logprobs = teacher.logprobs(batch, temperature=cfg.temperature)
        totals["teacher_logprob"] = totals.get("teacher_logprob", 0.0) + float(
            (teacher_logprobs * loss_token_mask(batch)).sum() / normalizer.num_valid_tokens)
        totals["response_length_mean"] += float(batch["response_lengths"].sum()) / num_rows
    return totals
