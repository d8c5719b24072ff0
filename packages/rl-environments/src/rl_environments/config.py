"""Config sections for environments and datasets (strict: unknown keys are errors)."""

from __future__ import annotations

import importlib
from typing import Annotated, Any, Literal

from pydantic import Field

from rl_core.config import StrictModel
from rl_core.data_files import BadRowPolicy, DataError, FileFormat, Loaded
from rl_core.protocols import Environment
from rl_core.types import PromptSample
from rl_environments.arithmetic import ArithmeticDatasetConfig
from rl_environments.countdown import CountdownDatasetConfig
from rl_environments.dataset_base import PromptCheck, PromptDatasetConfig
from rl_environments.shapes import ShapesDatasetConfig
from rl_environments.sliding_puzzle import SlidingPuzzleDatasetConfig
from rl_environments.splits import Split


class EnvConfig(StrictModel):
    """One environment, built with ``build_environment(name, **kwargs)``."""

    name: str = "arithmetic"
    """A registered environment: arithmetic, countdown, math, code, tools, sliding_puzzle, shapes, reward_model,
    reward_function, or one registered by a module in ``import_modules``."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Constructor arguments, e.g. ``{answer_format: either}`` or ``{fn: "my_pkg.rewards:score"}``."""
    import_modules: list[str] = Field(default_factory=list)
    """Modules imported first (they may call ``register_environment``)."""

    def build(self) -> Environment:
        from rl_environments.registry import build_environment

        for module in self.import_modules:
            importlib.import_module(module)
        return build_environment(self.name, **self.kwargs)


class ToolsDatasetConfig(ArithmeticDatasetConfig):
    """Arithmetic questions posed with the tool instructions (default: 3-digit products)."""

    kind: Literal["tools"] = "tools"
    digits: int = Field(3, ge=1, le=9)
    operators: list[Literal["+", "-", "*"]] = Field(default_factory=lambda: ["*"], min_length=1)

    def generate(self, split: Split, size: int | None) -> list[PromptSample]:
        from rl_environments.tools import tools_split

        return tools_split(self, split, size)


class PromptFieldsConfig(StrictModel):
    """How the rows of a prompt file become prompts: which fields hold what, and what to do with a bad row."""

    prompt_field: str = "prompt"
    """Field holding the prompt: a string (one user message) or a list of {role, content} messages, as in
    TRL's prompt-only datasets. Rows without it may use ``problem`` while this is left at ``prompt``."""
    messages_field: str | None = None
    """Field holding a ready chat (list of {role, content}); overrides ``prompt_field``."""
    answer_field: str | None = "answer"
    """Field copied to ``metadata['answer']`` (None: no answer)."""
    images_field: str | None = None
    """Prompts with images, for a vision-language model (docs/vlm.md): the field holding a row's images (a path
    relative to the file, a ``data:`` URL, image bytes, or a list of them), put before the prompt text or
    filling the ``{"type": "image"}`` parts of ``messages_field`` in order; image parts with their own
    reference need no such field. None: text prompts."""
    metadata_fields: list[str] = Field(default_factory=list)
    """More fields copied into metadata under their own names."""
    instruction: str | None = None
    """Appended (after a space) to the text of the last user message, e.g. ``"Put your final answer in
    \\boxed{}."`` (None: the prompt is used as it is)."""
    system_prompt: str | None = None
    limit: int | None = Field(None, gt=0)
    """Use at most this many rows (the first ones)."""
    format: FileFormat = "auto"
    """``auto``: a directory is a ``datasets`` directory, a file goes by its extension (``.jsonl``, ``.json``,
    ``.parquet``)."""
    on_bad_row: BadRowPolicy = "error"
    """``error``: stop with a message naming the file and row. ``skip``: drop the row and count it."""


class FileDatasetConfig(PromptFieldsConfig, PromptDatasetConfig):
    """Prompts from JSONL / JSON / parquet files or ``datasets`` ``save_to_disk`` directories, one per
    split. Every row is checked before a run starts: a bad row stops it with the file and row named, or
    is skipped and counted (``on_bad_row``)."""

    kind: Literal["file"] = "file"
    train_path: str | None = None
    """Training prompts: a ``.jsonl``, ``.json`` or ``.parquet`` file, or a ``save_to_disk`` directory (of a
    DatasetDict: its ``train`` split, or name one as ``<dir>/<split>``)."""
    validation_path: str | None = None
    """Held-out prompts for validation, in the same forms (a DatasetDict: its ``validation`` split)."""
    test_path: str | None = None
    """Test prompts, in the same forms (a DatasetDict: its ``test`` split)."""
    env: str | None = None
    """Environment that grades these prompts (None: the recipe's default)."""

    def has_split(self, split: Split) -> bool:
        return getattr(self, f"{split}_path") is not None

    def load(self, split: Split, size: int | None = None, check: PromptCheck | None = None) -> Loaded[PromptSample]:
        from rl_environments.datasets import load_prompt_file

        path = getattr(self, f"{split}_path")
        if not self.has_split(split):
            raise DataError(f"the dataset has no {split}_path; set data.{split}_path to a .jsonl, .json or .parquet "
                            "file or a datasets directory")
        loaded = load_prompt_file(path, self, check, split=split)
        limit = min(n for n in (size, self.limit, len(loaded.items)) if n is not None)
        return Loaded(loaded.items[:limit], loaded.report)


DatasetConfig = Annotated[
    ArithmeticDatasetConfig | CountdownDatasetConfig | SlidingPuzzleDatasetConfig | ToolsDatasetConfig
    | FileDatasetConfig | ShapesDatasetConfig,
    Field(discriminator="kind"),
]
