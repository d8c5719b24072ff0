"""Read rows from JSONL or parquet files, one ``(location, record | BadRow)`` at a time.

Rows that cannot be decoded (invalid JSON, bytes that are not UTF-8, not an object) are yielded as a
:class:`BadRow` so that the caller applies its ``on_bad_row`` policy in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl_algorithms.data.config import FileFormat
from rl_algorithms.data.errors import BadRow, DataError, RowLocation

Record = dict[str, Any]


def detect_format(path: str | Path, file_format: FileFormat = "auto") -> str:
    """``jsonl`` or ``parquet`` from the config value or the file extension."""
    if file_format != "auto":
        return file_format
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise DataError(f"{path}: cannot tell the file format from the extension {suffix!r}; "
                    "use .jsonl or .parquet, or set data.format=jsonl|parquet")


def read_records(path: str | Path, file_format: FileFormat = "auto") -> Iterator[tuple[RowLocation, Record | BadRow]]:
    """Every row of ``path`` with its location; undecodable rows come as :class:`BadRow`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: dataset file not found (check data.train_path / data.validation_path)")
    if detect_format(path, file_format) == "jsonl":
        yield from _read_jsonl(path)
    else:
        yield from _read_parquet(path)


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
            if not isinstance(record, dict):
                yield location, BadRow(f"expected a JSON object, got {type(record).__name__}")
                continue
            yield location, record


def _read_parquet(path: Path) -> Iterator[tuple[RowLocation, Record | BadRow]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for row_number, record in enumerate(table.to_pylist(), start=1):
        location = RowLocation(str(path), row_number, "row")
        try:
            yield location, {key: _decode_binary(value) for key, value in record.items()}
        except BadRow as bad:
            yield location, bad


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
