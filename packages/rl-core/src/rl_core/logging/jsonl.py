"""The JSONL metrics file: one ``{"step": ..., "timestamp": ..., "<name>": value}`` object per line."""

from __future__ import annotations

import json
import logging
import math
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
        self.write({"step": step, "timestamp": time.time(), **metrics})

    def write(self, record: dict) -> None:
        # One write() of a whole line on an O_APPEND file: lines never interleave or split.
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


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
