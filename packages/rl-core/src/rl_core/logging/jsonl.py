"""The JSONL metrics file: one ``{"step": ..., "timestamp": ..., "<name>": value}`` object per line."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)


class JsonlWriter:
    """Appends one line per record and flushes it, so a crashed run keeps every finished step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.write({"step": int(step), "timestamp": time.time(), **metrics})

    def write(self, record: dict) -> None:
        # One write() of a whole line on an O_APPEND file: lines never interleave or split.
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def cut_after_step(path: str | Path, step: int) -> int:
    """Drop the lines of a per-step JSONL file (``metrics.jsonl``, ``samples.jsonl``) whose ``step``
    is past ``step``: a run resumed from the checkpoint of ``step`` logs them again. Kept lines stay
    byte for byte; a torn last line goes too. The file is replaced atomically (a temporary file in
    the same directory, then a rename), and only when something is dropped. Returns the number of
    lines dropped; a missing file is nothing to do."""
    path = Path(path)
    if not path.exists():
        return 0
    lines = path.read_bytes().splitlines(keepends=True)
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            line_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError) as e:
            if number == len(lines):
                continue  # torn by a kill mid-write
            raise ValueError(f"{path}:{number}: not a record with a step ({e}): {line[:200]!r}") from e
        if line_step <= step:
            kept.append(line)
    if len(kept) == len(lines):
        return 0
    if kept and not kept[-1].endswith(b"\n"):
        kept[-1] += b"\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return len(lines) - len(kept)


def read_jsonl_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics JSONL file, in file order. A torn last line (a run killed mid-write)
    is skipped with a warning; a broken line elsewhere is an error naming the line."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):
                logger.warning("%s:%d: skipping a torn last line (%s)", path, number, e)
                continue
            raise ValueError(f"{path}:{number}: not a JSON object ({e}): {line[:200]!r}") from e
    return records


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric across records, skipping records without it and NaNs."""
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, int | float) and not math.isnan(value):
            steps.append(record["step"])
            values.append(float(value))
    return steps, values
