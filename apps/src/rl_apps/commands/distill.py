"""``rl distill``: on-policy distillation from a frozen teacher that shares the student's tokenizer.

The student samples with the generation backend, the teacher (a second training backend that is never
trained: learning rate 0) gives its top-k logits on those samples, the student takes one step on the
top-k KL, and its new weights are refitted into the generation backend.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from rl_algorithms.checkpointing import CheckpointConfig
from rl_algorithms.data import DataError, PromptDataConfig, SyntheticDataConfig, load_prompt_dataset, pad_token_id_of
from rl_algorithms.distill import DistillConfig, distill_train
from rl_apps import recipe_path
from rl_apps.run_setup import build_backend, export, fail, items, load_splits, open_run, resolve_with_tokenizer
from rl_backends_gen import GenerationConfig, build_generation_backend
from rl_backends_train import TrainBackendConfig
from rl_core.cluster import ClusterConfig
from rl_core.config import StrictModel
from rl_core.logging import LoggerConfig
from rl_core.seed import set_seed


class TeacherConfig(StrictModel):
    """The frozen teacher: a model and the backend it runs on (its optimizer is never stepped usefully: lr 0)."""

    model: str = "tiny-qwen2"
    """A model name or a local HF directory."""
    backend: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    """Sharding and dtype of the teacher; its optimizer, LoRA and reference settings are ignored."""

    def frozen_backend(self) -> TrainBackendConfig:
        optimizer = self.backend.optimizer.model_copy(update={"lr": 0.0})
        return self.backend.model_copy(update={"optimizer": optimizer, "lora": None, "reference_model": False,
                                               "task": "causal_lm"})


class DistillRunConfig(StrictModel):
    """Everything ``rl distill`` needs."""

    model: str = "tiny-llama"
    """The student: a model name (``smollm2-135m-instruct``, ``tiny-llama``, ``tiny-qwen2``) or an HF directory."""
    output_dir: str = "runs/distill"
    seed: int = 0
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    policy: TrainBackendConfig = Field(default_factory=TrainBackendConfig)
    """The student's training backend."""
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """The student's generation backend (refitted with the student's weights after every step)."""
    data: PromptDataConfig = Field(default_factory=PromptDataConfig)
    synthetic_data: SyntheticDataConfig | None = None
    """Generate arithmetic prompts into ``<output_dir>/data`` instead of reading ``data.train_path``."""
    distill: DistillConfig = Field(default_factory=DistillConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    checkpointing: CheckpointConfig = Field(default_factory=CheckpointConfig)
    export_hf: bool = True
    """Write the final student as an HF directory to ``<output_dir>/hf``."""


CONFIG_CLASS = DistillRunConfig
DEFAULT_RECIPE = recipe_path("distill_tiny.yaml")


def run(cfg: DistillRunConfig) -> int:
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    student_path, tokenizer = resolve_with_tokenizer(cfg.model)
    teacher_path, teacher_tokenizer = resolve_with_tokenizer(cfg.teacher.model)
    if tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        return fail("distill", ValueError(
            f"the teacher {cfg.teacher.model!r} and the student {cfg.model!r} use different tokenizers; "
            "use `rl xtoken-distill` for cross-tokenizer distillation"))
    vocab_size = logits_width(student_path)
    if logits_width(teacher_path) > vocab_size:
        return fail("distill", ValueError("the teacher's vocabulary is wider than the student's logits"))
    try:
        train, val = load_splits(cfg.data, cfg.synthetic_data, "prompts", out,
                                 lambda path: load_prompt_dataset(path, cfg.data, tokenizer))
    except DataError as e:
        return fail("distill", e)

    with open_run(cfg, out, cfg.distill.max_steps) as (logger, checkpointer):
        student = build_backend(cfg.policy.model_copy(update={"reference_model": False}), student_path, cfg.cluster,
                                seed=cfg.seed)
        teacher = generation = None
        try:
            teacher = build_backend(cfg.teacher.frozen_backend(), teacher_path, cfg.cluster, seed=cfg.seed, name="teacher")
            generation = build_generation_backend(cfg.generation, student_path)
            distill_train(cfg.distill, student, teacher, generation, train.items,
                          pad_token_id=pad_token_id_of(tokenizer), stop_token_ids=stop_tokens(tokenizer),
                          val_prompts=items(val), vocab_size=vocab_size, logger=logger,
                          checkpointer=checkpointer, seed=cfg.seed)
            if cfg.export_hf:
                export(student, out, lora=cfg.policy.lora is not None)
        finally:
            for backend in (generation, teacher, student):
                if backend is not None:
                    backend.shutdown()
    return 0


def logits_width(model_path: str) -> int:
    """The model's output vocabulary size (may exceed the tokenizer's length)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_path).vocab_size)


def stop_tokens(tokenizer) -> tuple[int, ...]:
    return tuple(t for t in [tokenizer.eos_token_id] if t is not None)

