"""A run's output directory: what a run owns in it, a previous run found there, and the run's identity.

A run owns these names in its ``output_dir``, and nothing else there::

    run.json  config.yaml  metrics.jsonl  samples.jsonl  validation.jsonl  metrics.png  tensorboard/  wandb/
    mlflow.db  mlartifacts/  checkpoints/  hf/  hf_best/  adapter/  draft/  data/<synthetic files>

plus the ``step_*`` checkpoints of its checkpoint directory when ``checkpointing.dir`` puts them elsewhere.

* A fresh run (``checkpointing.resume`` false) into a directory holding any of them is refused: exit 2
  with one line naming ``checkpointing.resume=true`` and ``--overwrite``. Nothing is deleted unless
  ``--overwrite`` is given, and then exactly those names, never anything else in the directory (nor a
  model or data file the run reads).
* ``run.json`` is the run's identity: ``run_id`` (uuid4 hex), ``created`` (UTC, ISO 8601) and the
  ``command`` line. A fresh run writes a new one; a resumed run reads it (a directory without one gets
  a new one). Checkpoints record the run id, so a run never prunes or resumes another run's.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rl_core.config import ConfigError, ConfigProblem

RUN_FILE = "run.json"
OWNED_NAMES = ("run.json", "config.yaml", "metrics.jsonl", "samples.jsonl", "validation.jsonl", "metrics.png",
               "tensorboard", "wandb", "mlflow.db", "mlartifacts", "checkpoints", "hf", "hf_best", "adapter",
               "draft")
"""What a run writes into its output directory (its synthetic data files come on top)."""
_FORBIDDEN_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
"""Pseudo file systems: an output directory there is a typo, never a place for a run."""


@dataclass(frozen=True)
class Invocation:
    """How the command was called: what is not config (it describes this call, not the run)."""

    command: str
    """The command line, recorded in ``run.json``."""
    overwrite: bool = False
    """``--overwrite``: remove a previous run's files from the output directory first."""


_INVOCATION: ContextVar[Invocation | None] = ContextVar("rl_invocation", default=None)


@contextmanager
def invoked(command: str, overwrite: bool = False) -> Iterator[None]:
    """Runs started inside see this invocation (the ``rl`` CLI wraps each command in it)."""
    token = _INVOCATION.set(Invocation(command, overwrite))
    try:
        yield
    finally:
        _INVOCATION.reset(token)


def current_invocation() -> Invocation:
    """The invocation set by :func:`invoked`; outside one (a command's ``run(cfg)`` called from Python):
    this process's command line, no overwrite."""
    return _INVOCATION.get() or Invocation(shlex.join(sys.argv))


@dataclass(frozen=True)
class RunIdentity:
    """The contents of ``run.json``."""

    run_id: str
    created: str
    command: str

    @classmethod
    def new(cls, command: str) -> RunIdentity:
        return cls(uuid.uuid4().hex, datetime.now(UTC).isoformat(timespec="seconds"), command)


def check_output_dir(out: Path) -> None:
    """ConfigError at ``output_dir`` when the run could not write there: a file, under /proc, /sys or /dev,
    below a file, or (the nearest existing directory) not writable. Writes nothing."""
    if any(out == root or root in out.parents for root in _FORBIDDEN_ROOTS):
        raise _output_dir_error(f"{out} is in a pseudo file system; choose a directory on disk")
    if out.exists() and not out.is_dir():
        raise _output_dir_error(f"{out} is a file, not a directory; choose another output_dir")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise _output_dir_error(f"{existing} is a file, so {out} cannot be created; choose another output_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _output_dir_error(f"{existing} is not writable; choose another output_dir")


def previous_run(out: Path, checkpoint_dir: Path, data_files: list[str]) -> list[Path]:
    """What an earlier run left that this run would write: the owned names present in ``out``, its
    synthetic ``data_files`` (relative to ``out``), and the step checkpoints of ``checkpoint_dir``
    when that is not ``out/checkpoints``."""
    found = [out / name for name in (*OWNED_NAMES, *data_files) if (out / name).exists()]
    if checkpoint_dir != out / "checkpoints" and checkpoint_dir.is_dir():
        found += sorted(p for p in checkpoint_dir.iterdir() if p.name.startswith(("step_", ".step_")))
    return found


def refuse_previous_run(out: Path, found: list[Path]) -> None:
    names = ", ".join(_shown(p, out) for p in found[:4]) + (", ..." if len(found) > 4 else "")
    raise _output_dir_error(f"{out} holds a previous run ({names}); continue it with checkpointing.resume=true, "
                            "replace it with --overwrite, or choose another output_dir")


def check_inputs_survive(cfg_values: dict[str, Any], out: Path, removed: list[Path]) -> None:
    """ConfigError when a path the config reads (a model, a data file) would be removed by --overwrite."""
    if not removed:
        return
    for key, value in _string_leaves(cfg_values):
        if key in ("output_dir", "checkpointing.dir") or not value or not Path(value).exists():
            continue
        path = Path(value).absolute()
        if path == out or any(_within(path, r) for r in removed):
            raise ConfigError(ConfigProblem("config", key, f"{value} is part of the previous run in {out} that "
                                            "--overwrite would remove; copy it elsewhere or choose another output_dir"))


def remove(paths: list[Path]) -> None:
    """Remove a previous run's files (``previous_run``'s list) and a ``data/`` folder left empty."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for folder in {p.parent for p in paths if p.parent.name == "data"}:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def read_identity(out: Path) -> RunIdentity | None:
    """``run.json`` of ``out``; None when there is none. A damaged one is a ConfigError naming it."""
    path = out / RUN_FILE
    if not path.exists():
        return None
    try:
        return RunIdentity(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(ConfigProblem(str(path), "", f"unreadable run identity ({type(e).__name__}: {e}); "
                                        "restore it, or start over with --overwrite")) from None


def write_identity(out: Path, identity: RunIdentity) -> None:
    write_atomically(out / RUN_FILE, json.dumps(asdict(identity), indent=1) + "\n")


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _output_dir_error(message: str) -> ConfigError:
    return ConfigError(ConfigProblem("config", "output_dir", message))


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _shown(path: Path, out: Path) -> str:
    name = str(path.relative_to(out)) if _within(path, out) else str(path)
    return name + "/" if path.is_dir() else name


def _string_leaves(values: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(values, dict):
        for key, value in values.items():
            yield from _string_leaves(value, f"{prefix}{key}.")
    elif isinstance(values, list):
        for index, value in enumerate(values):
            yield from _string_leaves(value, f"{prefix}{index}.")
    elif isinstance(values, str):
        yield prefix.rstrip("."), values
