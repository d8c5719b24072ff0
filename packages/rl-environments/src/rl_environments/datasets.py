"""Datasets as lists of ``PromptSample``: the procedural sets and JSONL / JSON / parquet files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_core.types import PromptSample
from rl_environments.arithmetic import ArithmeticDatasetConfig, arithmetic_split
from rl_environments.config import DatasetConfig, FileDatasetConfig, ToolsDatasetConfig
from rl_environments.countdown import CountdownDatasetConfig, countdown_split
from rl_environments.shapes import ShapesDatasetConfig
from rl_environments.sliding_puzzle import SlidingPuzzleDatasetConfig, sliding_puzzle_split
from rl_environments.splits import Split
from rl_environments.tools import tools_split


def build_dataset(cfg: DatasetConfig, split: Split, size: int | None = None) -> list[PromptSample]:
    """The ``split`` of the dataset ``cfg`` describes (``size`` overrides the configured split size)."""
    if isinstance(cfg, ToolsDatasetConfig):
        return tools_split(cfg, split, size)
    if isinstance(cfg, ArithmeticDatasetConfig):
        return arithmetic_split(cfg, split, size)
    if isinstance(cfg, CountdownDatasetConfig):
        return countdown_split(cfg, split, size)
    if isinstance(cfg, SlidingPuzzleDatasetConfig):
        return sliding_puzzle_split(cfg, split, size)
    if isinstance(cfg, ShapesDatasetConfig):
        return cfg.build(split, size)
    if isinstance(cfg, FileDatasetConfig):
        path = getattr(cfg, f"{split}_path")
        if path is None:
            raise ValueError(f"dataset has no {split}_path; set it to a .jsonl, .json or .parquet file")
        samples = load_prompt_file(path, cfg)
        return samples if size is None else samples[:size]
    raise TypeError(f"unknown dataset config {type(cfg).__name__}")


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .json (a list of objects) / .parquet file. Errors name the file and row."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with path.open(encoding="utf-8") as f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{line_number}: not valid JSON ({err.msg})") from err
        records = rows
    elif suffix == ".json":
        try:
            records = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err
        if not isinstance(records, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of objects")
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError('Please install "pyarrow" to read parquet datasets') from err
        records = pq.read_table(path).to_pylist()
    else:
        raise ValueError(f"{path}: unsupported dataset format {suffix!r}; use .jsonl, .json or .parquet")
    for i, row in enumerate(records):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i + 1} is a {type(row).__name__}, expected an object")
    return records


def load_prompt_file(path: str | Path, cfg: FileDatasetConfig) -> list[PromptSample]:
    """PromptSamples from a file, with the field mapping of ``cfg``."""
    samples = []
    for i, row in enumerate(read_records(path)):
        if cfg.limit is not None and i >= cfg.limit:
            break
        where = f"{path}: row {i + 1}"
        samples.append(record_to_sample(row, cfg, where))
    return samples


def record_to_sample(row: dict[str, Any], cfg: FileDatasetConfig, where: str) -> PromptSample:
    def field(name: str) -> Any:
        if name not in row:
            raise KeyError(f"{where}: missing field {name!r} (fields present: {sorted(row)})")
        return row[name]

    if cfg.messages_field:
        messages = field(cfg.messages_field)
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError(f"{where}: {cfg.messages_field!r} must be a list of {{role, content}} objects")
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    else:
        question = str(field(cfg.prompt_field))
        if cfg.instruction:
            question = f"{question} {cfg.instruction}"
        messages = [{"role": "user", "content": question}]
    if cfg.system_prompt and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    metadata = {name: field(name) for name in cfg.metadata_fields}
    if cfg.answer_field:
        metadata["answer"] = str(field(cfg.answer_field))
    return PromptSample(messages=messages, metadata=metadata, env=cfg.env)
