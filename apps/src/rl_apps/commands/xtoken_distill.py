"""``rl xtoken-distill``: off-policy distillation on fixed texts from a teacher with a different tokenizer.

Both models read the same texts, each with its own tokenizer; positions are aligned by character
offsets and the student's distribution is projected into the teacher's vocabulary (docs/distillation.md).
"""

from __future__ import annotations

import sys

from pydantic import Field

from rl_algorithms.data import TextDataConfig, load_text_dataset
from rl_algorithms.xtoken import XTokenConfig, XTokenTokenizers, build_vocab_projection, xtoken_distill_train
from rl_apps import recipe_path
from rl_apps.run_config import TeacherRunConfig
from rl_apps.run_setup import items, load_splits, logits_width, open_run, resolve_with_tokenizer, start_run


class XTokenRunConfig(TeacherRunConfig):
    """Everything ``rl xtoken-distill`` needs."""

    LOOP_SECTION = "xtoken"
    SYNTHETIC_KIND = "text"

    output_dir: str = "runs/xtoken"
    data: TextDataConfig = Field(default_factory=TextDataConfig)
    xtoken: XTokenConfig = Field(default_factory=XTokenConfig)


CONFIG_CLASS = XTokenRunConfig
DEFAULT_RECIPE = recipe_path("xtoken_tiny.yaml")


def run(cfg: XTokenRunConfig) -> int:
    student_path, student_tokenizer = start_run(cfg)
    teacher_path, teacher_tokenizer = resolve_with_tokenizer(cfg.teacher.model)
    tokenizers = XTokenTokenizers.build(student_tokenizer, teacher_tokenizer)
    projection = build_vocab_projection(student_tokenizer, teacher_tokenizer)
    print(f"vocabulary projection: {projection.num_exact} exact, {projection.num_first_token} first-token, "
          f"{projection.num_unmapped} unmapped student tokens", file=sys.stderr)
    both = [student_tokenizer, teacher_tokenizer]
    train, val = load_splits(cfg, lambda path: load_text_dataset(path, cfg.data, both))
    with open_run(cfg) as run:
        student = run.backend(cfg.policy.model_copy(update={"reference_model": False}), student_path)
        teacher = run.backend(cfg.teacher.frozen_backend(), teacher_path, name="teacher")
        xtoken_distill_train(cfg.xtoken, student, teacher, train.items, tokenizers, projection,
                             val_texts=items(val), student_vocab_size=logits_width(student_path),
                             logger=run.logger, checkpointer=run.checkpointer, seed=cfg.seed)
        run.finish(student)
    return 0
