"""Evaluation datasets: the procedural sets of rl-environments, JSONL/JSON/parquet files and HF
``datasets`` directories saved with ``save_to_disk`` (one reader for all: :mod:`rl_core.data_files`);
every one becomes a list of PromptSample."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from rl_core.config import StrictModel
from rl_core.types import PromptSample
from rl_environments import ArithmeticDatasetConfig, CountdownDatasetConfig
from rl_environments.config import PromptFieldsConfig
from rl_environments.datasets import load_prompt_file
from rl_environments.shapes import ShapesDatasetConfig
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
    """A .jsonl, .json (list of objects) or .parquet file, or a ``datasets`` ``save_to_disk`` directory
    (read by :mod:`rl_core.data_files`, as every dataset of the library)."""

    kind: Literal["file"] = "file"
    path: str
    split: str | None = None
    """Split of a saved DatasetDict directory (e.g. "test"); ``<path>/<split>`` works as well."""

    def samples(self, section: str) -> list[PromptSample]:
        return load_prompt_file(self.path, self, section=section, split=self.split).items[: self.limit]

    def default_name(self) -> str:
        return Path(self.path).stem


class HFDiskEvalDataset(FileEvalDataset):
    """A ``datasets`` ``save_to_disk`` directory: the same reader as ``kind: file`` (kept for existing configs)."""

    kind: Literal["hf_disk"] = "hf_disk"


class ProceduralEvalDataset(EvalSource):
    """A split of a procedural dataset of rl-environments (arithmetic, countdown, or shapes: questions about
    drawn images, for a vision-language model)."""

    kind: Literal["procedural"] = "procedural"
    source: Annotated[ArithmeticDatasetConfig | CountdownDatasetConfig | ShapesDatasetConfig,
                      Field(discriminator="kind")] = Field(default_factory=ArithmeticDatasetConfig)
    split: Literal["train", "validation", "test"] = "test"
    size: int | None = Field(None, gt=0)
    """Number of problems (default: the split's configured size)."""

    def samples(self, section: str) -> list[PromptSample]:
        return self.source.build(self.split, self.size)

    def default_name(self) -> str:
        return f"{self.source.kind}-{self.split}"

    def default_grader(self) -> str:
        return self.source.kind  # arithmetic, countdown and shapes grade their own problems


EvalDatasetSource = Annotated[ProceduralEvalDataset | FileEvalDataset | HFDiskEvalDataset, Field(discriminator="kind")]
