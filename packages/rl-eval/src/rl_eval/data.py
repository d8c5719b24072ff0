"""Evaluation datasets: the procedural sets of rl-environments, JSONL/JSON/parquet files and HF
``datasets`` directories saved with ``save_to_disk``; every one becomes a list of PromptSample."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from rl_core.config import StrictModel
from rl_core.types import PromptSample
from rl_environments import ArithmeticDatasetConfig, CountdownDatasetConfig, FileDatasetConfig, build_dataset
from rl_environments.datasets import read_records, record_to_sample
from rl_eval.errors import EvalError


class _Fields(StrictModel):
    prompt_field: str = "problem"
    """Field holding the question text (ignored when ``messages_field`` is set)."""
    messages_field: str | None = None
    """Field holding a ready chat (a list of {role, content})."""
    answer_field: str = "answer"
    """Field holding the reference answer (copied to metadata['answer'])."""
    metadata_fields: list[str] = Field(default_factory=list)
    """More fields the grader needs, copied into metadata."""
    instruction: str | None = "Put your final answer in \\boxed{}."
    """Appended to the question (None: nothing)."""
    system_prompt: str | None = None
    limit: int | None = Field(None, gt=0)
    """Evaluate at most this many rows."""

    def file_config(self) -> FileDatasetConfig:
        return FileDatasetConfig(prompt_field=self.prompt_field, messages_field=self.messages_field,
                                 answer_field=self.answer_field, metadata_fields=self.metadata_fields,
                                 instruction=self.instruction, system_prompt=self.system_prompt, limit=self.limit)


class FileEvalDataset(_Fields):
    """A .jsonl, .json (list of objects) or .parquet file."""

    kind: Literal["file"] = "file"
    path: str


class HFDiskEvalDataset(_Fields):
    """A directory written by ``datasets.Dataset.save_to_disk`` (or a DatasetDict's, with ``split``)."""

    kind: Literal["hf_disk"] = "hf_disk"
    path: str
    split: str | None = None
    """Split of a saved DatasetDict (e.g. "test")."""


class ProceduralEvalDataset(StrictModel):
    """A split of a procedural dataset of rl-environments (arithmetic or countdown)."""

    kind: Literal["procedural"] = "procedural"
    source: Annotated[ArithmeticDatasetConfig | CountdownDatasetConfig, Field(discriminator="kind")] = Field(
        default_factory=ArithmeticDatasetConfig)
    split: Literal["train", "validation", "test"] = "test"
    size: int | None = Field(None, gt=0)
    """Number of problems (default: the split's configured size)."""


EvalDatasetSource = Annotated[ProceduralEvalDataset | FileEvalDataset | HFDiskEvalDataset, Field(discriminator="kind")]


def default_dataset_name(cfg: EvalDatasetSource) -> str:
    if isinstance(cfg, ProceduralEvalDataset):
        return f"{cfg.source.kind}-{cfg.split}"
    return Path(cfg.path).stem if isinstance(cfg, FileEvalDataset) else Path(cfg.path).name


def load_eval_dataset(cfg: EvalDatasetSource) -> list[PromptSample]:
    """The items of one evaluation dataset; errors name the file and row, and an empty set is an error."""
    try:
        if isinstance(cfg, ProceduralEvalDataset):
            samples = build_dataset(cfg.source, cfg.split, cfg.size)
            where = f"{cfg.source.kind} dataset, split {cfg.split}"
        else:
            rows, where = _rows(cfg)
            fc = cfg.file_config()
            if cfg.limit is not None:
                rows = rows[: cfg.limit]
            samples = [record_to_sample(row, fc, f"{where}: row {i + 1}") for i, row in enumerate(rows)]
    except (KeyError, ValueError, FileNotFoundError, ImportError) as e:
        raise EvalError(str(e).strip("'\"")) from None
    if not samples:
        raise EvalError(f"{where}: the dataset is empty; point it at a file with rows or raise its size")
    return samples


def _rows(cfg: FileEvalDataset | HFDiskEvalDataset) -> tuple[list[dict], str]:
    if isinstance(cfg, FileEvalDataset):
        return read_records(cfg.path), cfg.path
    try:
        import datasets
    except ImportError:
        raise EvalError('reading a datasets directory needs the datasets package: pip install "rl-eval[datasets]"') from None
    if not Path(cfg.path).is_dir():
        raise EvalError(f"{cfg.path}: no such directory (expected a datasets save_to_disk directory)")
    loaded = datasets.load_from_disk(cfg.path)
    if isinstance(loaded, datasets.DatasetDict):
        if cfg.split is None or cfg.split not in loaded:
            raise EvalError(f"{cfg.path}: holds splits {sorted(loaded)}; set split to one of them")
        loaded = loaded[cfg.split]
    return list(loaded), f"{cfg.path}" + (f" [{cfg.split}]" if cfg.split else "")
