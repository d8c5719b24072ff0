"""Evaluation datasets: the procedural sets of rl-environments, JSONL/JSON/parquet files and HF
``datasets`` directories saved with ``save_to_disk``; every one becomes a list of PromptSample."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from rl_core.config import StrictModel
from rl_core.data_files import RowLocation, convert_rows
from rl_core.types import PromptSample
from rl_environments import ArithmeticDatasetConfig, CountdownDatasetConfig
from rl_environments.config import PromptFieldsConfig
from rl_environments.datasets import load_prompt_file, record_to_sample
from rl_eval.errors import EvalError


class FileEvalDataset(PromptFieldsConfig):
    """A .jsonl, .json (list of objects) or .parquet file."""

    kind: Literal["file"] = "file"
    path: str


class HFDiskEvalDataset(PromptFieldsConfig):
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


def load_eval_dataset(cfg: EvalDatasetSource, section: str = "data") -> list[PromptSample]:
    """The items of one evaluation dataset; errors name the file and row (``section``: the config
    section of ``cfg``), and an empty set is an error."""
    try:
        if isinstance(cfg, ProceduralEvalDataset):
            samples = cfg.source.build(cfg.split, cfg.size)
            if not samples:
                raise EvalError(f"{cfg.source.kind} dataset, split {cfg.split}: the dataset is empty; raise its size")
            return samples
        if isinstance(cfg, FileEvalDataset):
            loaded = load_prompt_file(cfg.path, cfg, section=section)
        else:
            loaded = convert_rows(*_hf_rows(cfg), lambda row: record_to_sample(row, cfg), on_bad_row=cfg.on_bad_row,
                                  section=section)
    except (KeyError, ValueError, ImportError) as e:
        raise EvalError(str(e).strip("'\"")) from None
    return loaded.items[: cfg.limit]


def _hf_rows(cfg: HFDiskEvalDataset) -> tuple[str, list[tuple[RowLocation, dict]]]:
    """``(name, rows with their locations)`` of a ``save_to_disk`` directory."""
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
    name = f"{cfg.path}" + (f" [{cfg.split}]" if cfg.split else "")
    return name, [(RowLocation(name, i, "row"), row) for i, row in enumerate(loaded, start=1)]
