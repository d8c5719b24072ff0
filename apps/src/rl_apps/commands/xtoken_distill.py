"""``rl xtoken-distill``: off-policy distillation on fixed texts from a teacher with a different tokenizer.

Both models read the same texts, each with its own tokenizer; positions are aligned by character
offsets and the student's distribution is projected into the teacher's vocabulary (docs/distillation.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field

from rl_algorithms.checkpointing import CheckpointConfig
from rl_algorithms.data import DataError, SyntheticDataConfig, TextDataConfig, load_text_dataset
from rl_algorithms.xtoken import XTokenConfig, XTokenTokenizers, build_vocab_projection, xtoken_distill_train
from rl_apps import recipe_path
from rl_apps.commands.distill import TeacherConfig, logits_width
from rl_apps.run_setup import build_backend, export, fail, items, load_splits, open_run, resolve_with_tokenizer
from rl_backends_train import TrainBackendConfig
from rl_core.cluster import ClusterConfig
from rl_core.config import StrictModel
from rl_core.logging import LoggerConfig
from rl_core.seed import set_seed


class XTokenRunConfig(StrictModel):
    """Everything ``rl xtoken-distill`` needs."""

    model: str = "tiny-llama"
    """The student: a model name or a local HF directory."""
    output_dir: str = "runs/xtoken"
    seed: int = 0
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    policy: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    """The student's training backend."""
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    data: TextDataConfig = Field(default_factory=TextDataConfig)
    synthetic_data: SyntheticDataConfig | None = None
    """Generate short texts into ``<output_dir>/data`` instead of reading ``data.train_path``."""
    xtoken: XTokenConfig = Field(default_factory=XTokenConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    checkpointing: CheckpointConfig = Field(default_factory=CheckpointConfig)
    export_hf: bool = True
    """Write the final student as an HF directory to ``<output_dir>/hf``."""


CONFIG_CLASS = XTokenRunConfig
DEFAULT_RECIPE = recipe_path("xtoken_tiny.yaml")


def run(cfg: XTokenRunConfig) -> int:
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    student_path, student_tokenizer = resolve_with_tokenizer(cfg.model)
    teacher_path, teacher_tokenizer = resolve_with_tokenizer(cfg.teacher.model)
    tokenizers = XTokenTokenizers.build(student_tokenizer, teacher_tokenizer)
    projection = build_vocab_projection(student_tokenizer, teacher_tokenizer)
    print(f"vocabulary projection: {projection.num_exact} exact, {projection.num_first_token} first-token, "
          f"{projection.num_unmapped} unmapped student tokens", file=sys.stderr)
    try:
        both = [student_tokenizer, teacher_tokenizer]
        train, val = load_splits(cfg.data, cfg.synthetic_data, "text", out,
                                 lambda path: load_text_dataset(path, cfg.data, both))
    except DataError as e:
        return fail("xtoken-distill", e)

    with open_run(cfg, out, cfg.xtoken.max_steps) as (logger, checkpointer):
        student = build_backend(cfg.policy.model_copy(update={"reference_model": False}), student_path, cfg.cluster,
                                seed=cfg.seed)
        teacher = None
        try:
            teacher = build_backend(cfg.teacher.frozen_backend(), teacher_path, cfg.cluster, seed=cfg.seed, name="teacher")
            xtoken_distill_train(cfg.xtoken, student, teacher, train.items, tokenizers, projection,
                                 val_texts=items(val), student_vocab_size=logits_width(student_path),
                                 logger=logger, checkpointer=checkpointer, seed=cfg.seed)
            if cfg.export_hf:
                export(student, out, lora=cfg.policy.lora is not None)
        finally:
            for backend in (teacher, student):
                if backend is not None:
                    backend.shutdown()
    return 0
