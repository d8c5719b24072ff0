"""``rl sft``: supervised fine-tuning (full or LoRA) on chat or prompt/response data; a vision-language model
trains on chats with images, through its own processor and chat template (docs/vlm.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from rl_algorithms.data import (
    ChatDataConfig,
    SyntheticDataConfig,
    load_chat_dataset,
    load_image_chat_dataset,
    pad_token_id_of,
)
from rl_algorithms.sft import SFTConfig, sft_train
from rl_apps import recipe_path
from rl_apps.run_config import SupervisedRunConfig
from rl_apps.run_setup import items, load_splits, open_run, start_run
from rl_core.config import ConfigError, ConfigProblem
from rl_core.data_files import Loaded
from rl_core.models.processor import is_vision_language_model
from rl_environments.shapes import ShapesDatasetConfig, write_shapes_sft_data


class ShapesSFTDataConfig(ShapesDatasetConfig):
    """Warm-up chats of the shapes task (``rl_environments.shapes``) for a vision-language model: each scene's
    image and question, and the reply ``\\boxed{<answer>}``; ``train_size`` training and ``validation_size``
    held-out rows (disjoint scenes), written as JSONL with PNG files."""

    kind: Literal["shapes"] = "shapes"
    """``shapes``: this set (a ``synthetic_data`` section without ``kind`` writes arithmetic chats)."""

    def write(self, kind: str, folder: str | Path) -> tuple[str, str | None]:
        splits = ("train", "validation") if self.validation_size else ("train",)
        paths = write_shapes_sft_data(self, folder, splits=splits)
        return str(paths["train"]), str(paths["validation"]) if self.validation_size else None


def _synthetic_kind(value: Any) -> str:
    """A section with a ``kind`` is a :class:`ShapesSFTDataConfig` (a wrong kind is then reported there)."""
    has_kind = "kind" in value if isinstance(value, dict) else hasattr(value, "kind")
    return "shapes" if has_kind else "chats"


SyntheticSFTData = Annotated[Annotated[SyntheticDataConfig, Tag("chats")] | Annotated[ShapesSFTDataConfig, Tag("shapes")],
                             Discriminator(_synthetic_kind)]


class SFTRunConfig(SupervisedRunConfig):
    """Everything ``rl sft`` needs."""

    LOOP_SECTION = "sft"
    SYNTHETIC_KIND = "sft"

    output_dir: str = "runs/sft"
    data: ChatDataConfig = Field(default_factory=ChatDataConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    synthetic_data: SyntheticSFTData | None = None
    """Generate a small dataset (written to ``<output_dir>/data``) instead of reading ``data.train_path``:
    arithmetic chats (``num_train``, ``num_val``), or with ``kind: shapes`` the shapes task's image chats for a
    vision-language model (the ``rl_environments.shapes`` settings: ``image_size``, ``question``, ``train_size``,
    ``validation_size``, ...)."""


CONFIG_CLASS = SFTRunConfig
DEFAULT_RECIPE = recipe_path("sft_tiny.yaml")


def run(cfg: SFTRunConfig) -> int:
    model_path, tokenizer = start_run(cfg)
    train, val = load_splits(cfg, chat_loader(cfg, model_path, tokenizer))
    with open_run(cfg) as run:
        policy = run.backend(cfg.policy.model_copy(update={"reference_model": False}), model_path)
        sft_train(cfg.sft, policy, train.items, pad_token_id=pad_token_id_of(tokenizer), val_data=items(val),
                  logger=run.logger, checkpointer=run.checkpointer, seed=cfg.seed)
        run.finish(policy)
    return 0


def chat_loader(cfg: SFTRunConfig, model_path: str, tokenizer) -> Callable[[str], Loaded]:
    """The loader of one data file: chats with images through the processor for a vision-language model
    (``start_run`` checked that the policy's backend can train it), text chats otherwise. Raises ConfigError."""
    if not is_vision_language_model(model_path):
        if isinstance(cfg.synthetic_data, ShapesSFTDataConfig):
            raise ConfigError(ConfigProblem("config", "synthetic_data.kind", f"'shapes' writes image chats, but "
                                            f"model {cfg.model!r} is a text-only model; use a vision-language model "
                                            "(e.g. tiny-qwen2_5_vl-s) or drop synthetic_data.kind"))
        return lambda path: load_chat_dataset(path, cfg.data, tokenizer)
    from rl_core.models.processor import load_processor

    processor = load_processor(model_path)  # start_run checked that the policy's backend can train it
    return lambda path: load_image_chat_dataset(path, cfg.data, processor)
