"""Helpers of the rl-checkpoint CLI tests (importable: tests/rl_checkpoint/conftest.py puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path

from rl_checkpoint.cli import main


def run_error(capsys, argv: list[str]) -> str:
    """Run the CLI expecting exit 2 and one ``rl-checkpoint: error:`` line on stderr; returns that line."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rl-checkpoint: error: ") and "\n" not in err, err
    return err


def no_leftovers(out: Path) -> None:
    """Neither the output nor a temporary sibling of it exists."""
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
