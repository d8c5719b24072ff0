"""Bad rows: what was wrong, in which file and row, and what to do about it."""

from __future__ import annotations

from dataclasses import dataclass


class BadRow(ValueError):
    """Raised by row parsers and tokenisers for a row that cannot be used (no location yet)."""


class DataError(ValueError):
    """A dataset could not be loaded; the message names the file and row and says what to do."""


@dataclass(frozen=True)
class RowLocation:
    """Where a row came from: its file and 1-based number (the line of a JSONL file)."""

    path: str
    number: int
    unit: str = "line"
    """``line`` for JSONL files, ``row`` for parquet files."""

    def __str__(self) -> str:
        return f"{self.path}, {self.unit} {self.number}"


def bad_row_error(location: RowLocation, reason: str) -> DataError:
    return DataError(
        f"{location}: {reason}. Fix or remove the row, or set data.on_bad_row=skip to skip bad rows."
    )
