"""Fixtures of the CLI-level tests: the `rl` command run in-process, a few tiny steps at a time."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from rl_apps.cli import main

QUIET = ("logger.tensorboard=false", "logger.plot=false")
"""What every CLI-level training run leaves out (the progress display prints plain lines: stdout is not a TTY)."""
NOT_COMPARED = ("timestamp", "/time/", "throughput", "/memory/")
"""Wall-clock measurements differ between any two runs; everything else in metrics.jsonl must match."""


@dataclass
class Result:
    code: int
    out: str
    err: str

    def error_lines(self, command: str) -> list[str]:
        """The lines of stderr that are the command's own errors (``rl <command>: ...``)."""
        return [line for line in self.err.splitlines() if line.startswith(f"rl {command}:")]


@pytest.fixture
def rl(capsys):
    """``rl(*argv) -> Result``: the `rl` command, in this process, with its exit code and output."""

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main([*argv, *(QUIET if argv[0] != "eval" else ())])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def _metrics_lines(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if not any(part in k for part in NOT_COMPARED)} for line in lines]


def _tree(folder: Path) -> dict[str, bytes | None]:
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture
def metrics_lines():
    """``metrics_lines(out)``: every line of ``<out>/metrics.jsonl`` without its wall-clock measurements."""
    return _metrics_lines


@pytest.fixture
def step_metrics():
    """``step_metrics(out, step)``: every metric logged at ``step`` in ``<out>/metrics.jsonl`` (its lines merged),
    without wall-clock measurements."""

    def merged(out: Path, step: int) -> dict:
        found: dict = {}
        for line in _metrics_lines(out):
            if line["step"] == step:
                found.update(line)
        return found

    return merged


@pytest.fixture
def tree():
    """``tree(folder)``: every path under ``folder`` with a file's bytes (None for a directory)."""
    return _tree
