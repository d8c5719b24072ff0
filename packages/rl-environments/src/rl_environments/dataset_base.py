"""The base of every prompt-dataset section (``data:`` of ``rl grpo``): ``cfg.build(split)`` gives its prompts."""

from __future__ import annotations

from collections.abc import Callable

from rl_core.config import StrictModel
from rl_core.data_files import BadRow, DataError, Loaded, LoadReport
from rl_core.types import PromptSample
from rl_environments.splits import Split

PromptCheck = Callable[[PromptSample], None]
"""Raises :class:`~rl_core.data_files.BadRow` for a prompt the caller cannot use (e.g. longer than its budget)."""


class PromptDatasetConfig(StrictModel):
    """A dataset of prompts with train / validation / test splits."""

    def build(self, split: Split, size: int | None = None) -> list[PromptSample]:
        """The prompts of ``split`` (``size`` overrides the configured split size)."""
        return self.load(split, size).items

    def load(self, split: Split, size: int | None = None, check: PromptCheck | None = None) -> Loaded[PromptSample]:
        """The prompts of ``split`` with a load report; every prompt passes ``check`` (or DataError)."""
        samples = self.generate(split, size)
        name = f"{getattr(self, 'kind', type(self).__name__)} dataset, {split} split"
        for i, sample in enumerate(samples, start=1):
            try:
                if check is not None:
                    check(sample)
            except BadRow as bad:
                raise DataError(f"{name}, problem {i}: {bad}; change the dataset's settings") from None
        return Loaded(samples, LoadReport(path=name, num_rows=len(samples)))

    def has_split(self, split: Split) -> bool:
        """Whether the dataset can give ``split`` (procedural ones always can)."""
        return True

    def generate(self, split: Split, size: int | None) -> list[PromptSample]:
        """The split's prompts; procedural datasets generate them."""
        raise NotImplementedError
