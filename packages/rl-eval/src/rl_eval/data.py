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


class EvalSource(StrictModel):
    """A dataset to evaluate: ``build()`` gives its items; errors name the file and row and an empty set
    is an error (both as :class:`EvalError`)."""

    def build(self, section: str = "data") -> list[PromptSample]:
        """The items (``section``: this source's config section, named in errors)."""
        try:
            samples = self.samples(section)
        except (KeyError, ValueError, ImportError) as e:
            raise EvalError(str(e).strip("'\"")) from None
        if not samples:
            raise EvalError(f"{self.default_name()}: the dataset is empty; point it at rows or raise its size")
        return samples

    def samples(self, section: str) -> list[PromptSample]:
        raise NotImplementedError

    def default_name(self) -> str:
        """The name shown in summaries when the dataset has none."""
        raise NotImplementedError

    def default_grader(self) -> str:
        """The environment that grades it when the config names none."""
        return "math"


class FileEvalDataset(PromptFieldsConfig, EvalSource):
    """A .jsonl, .json (list of objects) or .parquet file."""

    kind: Literal["file"] = "file"
    path: str

    def samples(self, section: str) -> list[PromptSample]:
        return load_prompt_file(self.path, self, section=section).items[: self.limit]

    def default_name(self) -> str:
        return Path(self.path).stem


class HFDiskEvalDataset(PromptFieldsConfig, EvalSource):
    """A directory written by ``datasets.Dataset.save_to_disk`` (or a DatasetDict's, with ``split``)."""

    kind: Literal["hf_disk"] = "hf_disk"
    path: str
    split: str | None = None
    """Split of a saved DatasetDict (e.g. "test")."""

    def samples(self, section: str) -> list[PromptSample]:
        name, rows = self._rows()
        loaded = convert_rows(name, rows, lambda row: record_to_sample(row, self), on_bad_row=self.on_bad_row,
                              section=section)
        return loaded.items[: self.limit]

    def default_name(self) -> str:
        return Path(self.path).name

    def _rows(self) -> tuple[str, list[tuple[RowLocation, dict]]]:
        """``(name, rows with their locations)`` of the ``save_to_disk`` directory."""
        try:
            import datasets
        except ImportError:
            raise EvalError('reading a datasets directory needs the datasets package: pip install "rl-eval[datasets]"') from None
        if not Path(self.path).is_dir():
            raise EvalError(f"{self.path}: no such directory (expected a datasets save_to_disk directory)")
        loaded = datasets.load_from_disk(self.path)
        if isinstance(loaded, datasets.DatasetDict):
            if self.split is None or self.split not in loaded:
                raise EvalError(f"{self.path}: holds splits {sorted(loaded)}; set split to one of them")
            loaded = loaded[self.split]
        name = f"{self.path}" + (f" [{self.split}]" if self.split else "")
        return name, [(RowLocation(name, i, "row"), row) for i, row in enumerate(loaded, start=1)]


class ProceduralEvalDataset(EvalSource):
    """A split of a procedural dataset of rl-environments (arithmetic or countdown)."""

    kind: Literal["procedural"] = "procedural"
    source: Annotated[ArithmeticDatasetConfig | CountdownDatasetConfig, Field(discriminator="kind")] = Field(
        default_factory=ArithmeticDatasetConfig)
    split: Literal["train", "validation", "test"] = "test"
    size: int | None = Field(None, gt=0)
    """Number of problems (default: the split's configured size)."""

    def samples(self, section: str) -> list[PromptSample]:
        return self.source.build(self.split, self.size)

    def default_name(self) -> str:
        return f"{self.source.kind}-{self.split}"

    def default_grader(self) -> str:
        return self.source.kind  # arithmetic and countdown grade their own problems


EvalDatasetSource = Annotated[ProceduralEvalDataset | FileEvalDataset | HFDiskEvalDataset, Field(discriminator="kind")]
