"""Datasets, row by row: JSONL, JSON (a list of objects), parquet files and HF ``datasets`` directories
(written by ``save_to_disk``), each row with its file and number.

The one reader behind every dataset of the library (SFT / DPO / RM / distillation data, GRPO prompt
files, evaluation sets). A row that cannot be used (not valid JSON or UTF-8, not an object, or refused by
the caller's ``convert``) is a :class:`BadRow`; :func:`load_rows` applies the ``on_bad_row`` policy to it
in one place: stop with a :class:`DataError` naming the file and row, or skip it and count it. A file that
cannot be read at all (a truncated parquet file, a broken ``save_to_disk`` directory) is a DataError naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

T = TypeVar("T")
Record = dict[str, Any]
BadRowPolicy = Literal["error", "skip"]
FileFormat = Literal["auto", "jsonl", "json", "parquet", "datasets"]
"""``auto``: a directory is a ``datasets`` directory, a file goes by its extension."""
DATASETS_INSTALL = 'pip install "rl-core[datasets]"'
"""What to install to read ``save_to_disk`` directories (the ``datasets`` package)."""
MAX_REASONS_KEPT = 20
REWRITE_PARQUET = ("write it again (it may be truncated or corrupt); if it holds JSON Lines or JSON, name it .jsonl or "
                   ".json and set the dataset's format to auto")
"""What to do about a parquet file that pyarrow cannot read."""
RESAVE_DATASET = "save the dataset again with save_to_disk (one of its files may be truncated or corrupt)"
"""What to do about a ``save_to_disk`` directory that ``datasets`` cannot read."""


class BadRow(ValueError):
    """Raised by row parsers for a row that cannot be used (the loader adds the file and row)."""


class DataError(ValueError):
    """A dataset could not be loaded; the message names the file and row and says what to do."""


@dataclass(frozen=True)
class RowLocation:
    """Where a row came from: its file and 1-based number (the line of a JSONL file)."""

    path: str
    number: int
    unit: str = "line"
    """``line`` for JSONL files, ``row`` for JSON lists and parquet files."""

    def __str__(self) -> str:
        return f"{self.path}, {self.unit} {self.number}"


@dataclass
class LoadReport:
    """What happened while loading one file."""

    path: str
    num_rows: int = 0
    """Rows read (blank JSONL lines are not rows)."""
    num_skipped: int = 0
    """Bad rows dropped under ``on_bad_row: skip``."""
    skipped_reasons: list[str] = field(default_factory=list)
    """``file, line N: reason`` of the first skipped rows (at most 20)."""

    @property
    def num_kept(self) -> int:
        return self.num_rows - self.num_skipped

    def summary(self) -> str:
        """``file: N rows used, M bad rows skipped`` and the first reasons, one per line."""
        lines = [f"{self.path}: {self.num_kept} rows used, {self.num_skipped} bad rows skipped"]
        return "\n".join(lines + [f"  skipped {reason}" for reason in self.skipped_reasons])


@dataclass
class Loaded(Generic[T]):
    """The usable items of a file, in file order, and the load report."""

    items: list[T]
    report: LoadReport

    def __len__(self) -> int:
        return len(self.items)


def load_rows(path: str | Path, convert: Callable[[Record], T], *, on_bad_row: BadRowPolicy = "error",
              file_format: FileFormat = "auto", section: str = "data", split: str | None = None) -> Loaded[T]:
    """Read ``path`` (``split``: of a saved DatasetDict) and ``convert`` each record (see :func:`convert_rows`)."""
    return convert_rows(str(path), read_rows(path, file_format, split), convert, on_bad_row=on_bad_row, section=section)


def convert_rows(name: str, rows: Iterable[tuple[RowLocation, Record | BadRow]], convert: Callable[[Record], T], *,
                 on_bad_row: BadRowPolicy = "error", section: str = "data") -> Loaded[T]:
    """``convert`` each record of ``rows`` (from the dataset ``name``); a bad row raises :class:`DataError`
    (``on_bad_row: error``) or is skipped and counted (``skip``). ``section`` is the config section
    that holds ``on_bad_row`` (named in the error). No rows, or no usable row, is a DataError."""
    report = LoadReport(path=name)
    items: list[T] = []
    for location, record in rows:
        report.num_rows += 1
        try:
            if isinstance(record, BadRow):
                raise record
            items.append(convert(record))
        except BadRow as bad:
            if on_bad_row == "error":
                raise DataError(f"{location}: {bad}. Fix or remove the row, or set {section}.on_bad_row=skip "
                                "to skip bad rows.") from None
            report.num_skipped += 1
            if len(report.skipped_reasons) < MAX_REASONS_KEPT:
                report.skipped_reasons.append(f"{location}: {bad}")
    if report.num_rows == 0:
        raise DataError(f"{name}: the dataset is empty (no rows); point it at a file with rows")
    if not items:
        raise DataError(f"{name}: no usable rows ({report.num_rows} read, {report.num_skipped} skipped as bad)")
    return Loaded(items, report)


def detect_format(path: str | Path, file_format: FileFormat = "auto") -> str:
    """``jsonl``, ``json``, ``parquet`` or ``datasets`` from the config value, else from the path: a
    directory is a ``datasets`` directory, a file goes by its extension."""
    if file_format != "auto":
        return file_format
    if Path(path).is_dir():
        return "datasets"
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".json":
        return "json"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise DataError(f"{path}: cannot tell the file format from the extension {suffix!r}; "
                    "use .jsonl, .json or .parquet (or a datasets save_to_disk directory), or set the "
                    "dataset's format to jsonl, json or parquet")


def read_rows(path: str | Path, file_format: FileFormat = "auto", split: str | None = None,
              ) -> Iterator[tuple[RowLocation, Record | BadRow]]:
    """Every row of ``path`` with its location; undecodable rows come as :class:`BadRow`.

    A ``.json`` file holds a list of objects, or (as written by many tools) one object per line. A
    directory is read with ``datasets.load_from_disk``; ``split`` picks one split of a saved
    ``DatasetDict`` (its ``<path>/<split>`` directory works as well)."""
    path = Path(path)
    kind = detect_format(path, file_format) if path.exists() else None
    if kind == "datasets" and path.is_file():
        raise DataError(f"{path}: a file, but the dataset's format is datasets (a save_to_disk directory); set it to "
                        "auto or to the file's format (jsonl, json or parquet)")
    if kind == "datasets":
        yield from _read_saved_dataset(path, split)
        return
    if not path.is_file():
        raise DataError(f"{path}: dataset file does not exist" if not path.exists() else
                        f"{path}: a directory, but the dataset's format is {file_format}; set it to auto or datasets")
    if kind == "json" and not _starts_with(path, b"["):
        kind = "jsonl"
    if kind == "jsonl":
        yield from _read_jsonl(path)
    elif kind == "json":
        yield from _read_json_list(path)
    else:
        yield from _read_parquet(path)


def _starts_with(path: Path, prefix: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(4096).lstrip().startswith(prefix)


def _read_jsonl(path: Path) -> Iterator[tuple[RowLocation, Record | BadRow]]:
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue  # blank lines are not rows
            location = RowLocation(str(path), line_number, "line")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield location, BadRow(f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte offset {e.start})")
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                yield location, BadRow(f"invalid JSON ({e.msg} at column {e.colno})")
                continue
            yield location, _object(record)


def _read_json_list(path: Path) -> Iterator[tuple[RowLocation, Record | BadRow]]:
    try:
        records = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(records, list):
        raise DataError(f"{path}: a .json dataset must hold a list of objects, got {type(records).__name__}")
    for row_number, record in enumerate(records, start=1):
        yield RowLocation(str(path), row_number, "row"), _object(record)


def _object(record: Any) -> Record | BadRow:
    return record if isinstance(record, dict) else BadRow(f"expected a JSON object, got {type(record).__name__}")


def _read_parquet(path: Path) -> Iterator[tuple[RowLocation, Record | BadRow]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f'{path}: reading parquet files needs pyarrow: pip install pyarrow') from None
    try:
        records = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as err:
        raise unreadable(path, "parquet file", err, REWRITE_PARQUET) from None
    yield from _decoded_rows(str(path), records)


def unreadable(path: str | Path, what: str, err: BaseException, fix: str) -> DataError:
    """``<path>: not a readable <what> (<the reader's first line>); <fix>``, for a file that pyarrow or
    ``datasets`` cannot read (truncated, corrupt, or another format)."""
    printable = "".join(c for c in str(err) if c.isprintable() or c == "\n")  # thrift errors hold raw bytes
    lines = [line.strip() for line in printable.splitlines() if line.strip()]
    reason = re.sub(r"^Could not open Parquet input source '.*?': ", "", lines[0]) if lines else type(err).__name__
    return DataError(f"{path}: not a readable {what} ({reason.rstrip(': ')}); {fix}")


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` holds the index files of a ``save_to_disk`` directory (a Dataset or a DatasetDict)."""
    return any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json"))


def _decoded_rows(name: str, records: Iterable[Record]) -> Iterator[tuple[RowLocation, Record | BadRow]]:
    """Columnar rows (parquet, arrow) with their binary values decoded as UTF-8."""
    for row_number, record in enumerate(records, start=1):
        location = RowLocation(name, row_number, "row")
        try:
            yield location, {key: _decode_binary(value) for key, value in record.items()}
        except BadRow as bad:
            yield location, bad


def _read_saved_dataset(path: Path, split: str | None) -> Iterator[tuple[RowLocation, Record | BadRow]]:
    """The rows of a ``save_to_disk`` directory (a Dataset, or one split of a DatasetDict)."""
    try:
        import datasets
        import pyarrow as pa
    except ImportError:
        raise DataError(f"{path}: reading a datasets (save_to_disk) directory needs the datasets package: "
                        f"{DATASETS_INSTALL}") from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as err:
        if is_saved_dataset(path):  # one of its data files is gone
            raise unreadable(path, "datasets save_to_disk directory", err, RESAVE_DATASET) from None
        raise DataError(f"{path}: a directory, but not one written by datasets' save_to_disk (no dataset_info.json "
                        "or dataset_dict.json); point the path at a .jsonl, .json or .parquet file or such a "
                        "directory") from None
    except (pa.ArrowException, OSError, ValueError) as err:  # a truncated .arrow file, a broken state.json
        raise unreadable(path, "datasets save_to_disk directory", err, RESAVE_DATASET) from None
    name = str(path)
    if isinstance(loaded, datasets.DatasetDict):
        if split is None or split not in loaded:
            asked = "no split was named" if split is None else f"it has no split {split!r}"
            raise DataError(f"{path}: a DatasetDict with the splits {sorted(loaded)} ({asked}); point the path at "
                            f"one of them, e.g. {path / sorted(loaded)[0]}")
        loaded, name = loaded[split], str(path / split)
    yield from _decoded_rows(name, loaded)


def _decode_binary(value: Any) -> Any:
    """Parquet binary columns hold raw bytes: decode them as UTF-8 (strictly), recursively."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadRow(f"not valid UTF-8 (byte 0x{value[e.start]:02x} at byte offset {e.start})") from None
    if isinstance(value, list):
        return [_decode_binary(v) for v in value]
    if isinstance(value, dict):
        return {k: _decode_binary(v) for k, v in value.items()}
    return value
