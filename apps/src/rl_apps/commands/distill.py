"""``rl distill``: on-policy distillation from a frozen teacher that shares the student's tokenizer.

The student samples with the generation backend, the teacher (a second training backend that is never
trained: learning rate 0) gives its top-k logits on those samples, the student takes one step on the
top-k KL, and its new weights are refitted into the generation backend.
"""

from __future__ import annotations

from pydantic import Field

from rl_algorithms.data import PromptDataConfig, load_prompt_dataset, pad_token_id_of
from rl_algorithms.distill import DistillConfig, distill_train
from rl_apps import recipe_path
from rl_apps.run_config import TeacherRunConfig
from rl_apps.run_setup import (
    check_fits_context,
    items,
    load_splits,
    logits_width,
    open_run,
    resolve_with_tokenizer,
    start_run,
    stop_tokens,
)
from rl_backends_gen import GenerationConfig
from rl_core.config import ConfigError, ConfigProblem


class DistillRunConfig(TeacherRunConfig):
    """Everything ``rl distill`` needs."""

    LOOP_SECTION = "distill"
    SYNTHETIC_KIND = "prompts"

    output_dir: str = "runs/distill"
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """The student's generation backend (refitted with the student's weights after every step)."""
    data: PromptDataConfig = Field(default_factory=PromptDataConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)

    def uses_ray(self) -> bool:
        return super().uses_ray() or self.generation.num_replicas > 0


CONFIG_CLASS = DistillRunConfig
DEFAULT_RECIPE = recipe_path("distill_tiny.yaml")


def checked_vocab_size(cfg: DistillRunConfig, student_path: str, tokenizer, teacher_path: str,
                       teacher_tokenizer) -> int:
    """The student's logits width, once the teacher is known to fit it: the same tokenizer, no wider logits."""
    if tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ConfigError(ConfigProblem("config", "teacher.model",
                                        f"the teacher {cfg.teacher.model!r} and the student {cfg.model!r} use "
                                        "different tokenizers; use `rl xtoken-distill` for cross-tokenizer distillation"))
    check_fits_context(student_path, {"distill.max_new_tokens": cfg.distill.max_new_tokens,
                                      "generation.max_seq_len": cfg.generation.max_seq_len})
    vocab_size = logits_width(student_path)
    if logits_width(teacher_path) > vocab_size:
        raise ConfigError(ConfigProblem("config", "teacher.model",
                                        "the teacher's vocabulary is wider than the student's logits"))
    return vocab_size


def run(cfg: DistillRunConfig) -> int:
    student_path, tokenizer = start_run(cfg)
    teacher_path, teacher_tokenizer = resolve_with_tokenizer(cfg.teacher.model)
    vocab_size = checked_vocab_size(cfg, student_path, tokenizer, teacher_path, teacher_tokenizer)
    train, val = load_splits(cfg, lambda path: load_prompt_dataset(path, cfg.data, tokenizer))
    with open_run(cfg) as run:
        student = run.backend(cfg.policy.model_copy(update={"reference_model": False}), student_path)
        teacher = run.backend(cfg.teacher.frozen_backend(), teacher_path, name="teacher")
        generation = run.generation(cfg.generation, student_path)
        distill_train(cfg.distill, student, teacher, generation, train.items,
                      pad_token_id=pad_token_id_of(tokenizer), stop_token_ids=stop_tokens(tokenizer),
                      val_prompts=items(val), vocab_size=vocab_size, logger=run.logger,
                      checkpointer=run.checkpointer, seed=cfg.seed)
        run.finish(student, generation)
    return 0
