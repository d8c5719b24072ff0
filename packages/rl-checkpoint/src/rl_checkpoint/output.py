"""Atomic output directories and config/tokenizer copying."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from rl_checkpoint.errors import CheckpointError

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".distcp")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# Folders of model files that are not weights: transformers' named chat templates (a processor's or a
# tokenizer's ``additional_chat_templates/<name>.jinja``).
_CONFIG_DIRS = ("additional_chat_templates",)


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, force: bool) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; on success it becomes ``out`` in one rename.

    A failed conversion removes the temporary directory; a killed one leaves only a hidden
    ``.<name>.tmp-*`` sibling, never a half-written ``out``, and the next conversion to ``out`` removes
    it. The temporary directory is flock-ed while in use, so a conversion still running is never touched."""
    out = Path(out)
    if out.exists() and not force:
        raise CheckpointError(f"{out}: already exists; pass --force to replace it")
    existing = next(p for p in out.absolute().parents if p.exists())
    if not existing.is_dir():
        raise CheckpointError(f"{existing}: is a file, so {out} cannot be created; choose another output path")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    lock = os.open(tmp, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process is killed
    try:
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    finally:
        os.close(lock)


def remove_stale_temporaries(out: Path) -> list[Path]:
    """Remove the ``.<name>.tmp-*`` directories of killed conversions to ``out`` (those no live process
    holds locked) and, once ``out`` exists, the ``.<name>.old-*`` ones of an interrupted replace."""
    removed = []
    for tmp in out.parent.glob(f".{out.name}.tmp-*"):
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a conversion in progress holds it
            continue
        finally:
            os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        removed.append(tmp)
    if out.exists():
        for old in out.parent.glob(f".{out.name}.old-*"):
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return removed


def check_output(out: str | Path, *inputs: str | Path, around: tuple[str | Path, ...] = ()) -> None:
    """Refuse an output that is an input, lies inside one, or holds one (``--force`` would destroy it).

    ``around``: directories the output may lie inside but neither be nor hold (a run directory, whose
    checkpoint is the real input)."""
    target = Path(out).resolve()
    for given in (*inputs, *around):
        source = Path(given).resolve()
        if source.is_relative_to(target):
            where = "is" if source == target else "holds"
            raise CheckpointError(f"{out}: {where} the input {given}; write the output outside the checkpoint")
    for given in inputs:
        if Path(given).is_dir() and target.is_relative_to(Path(given).resolve()):
            raise CheckpointError(f"{out}: is inside the input {given}; write the output outside the checkpoint")


def copy_config_files(src: Path | None, dst: Path) -> list[str]:
    """Copy config, generation config, tokenizer, processor and chat-template files (never weights)."""
    if src is None or not src.is_dir():
        return []
    copied = []
    for item in sorted(src.iterdir()):
        if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name not in _WEIGHT_INDEXES \
                and not item.name.startswith(".") and item.name not in ("meta.json", "adapter_config.json", "manifest.json"):
            shutil.copy2(item, dst / item.name)
            copied.append(item.name)
        elif item.is_dir() and item.name in _CONFIG_DIRS:
            shutil.copytree(item, dst / item.name)
            copied.append(item.name)
    return copied


def parse_size(text: str) -> int:
    """``"2GB"``, ``"500MB"``, ``"1024"`` -> bytes."""
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "B": 1}
    t = text.strip().upper()
    for unit, factor in units.items():
        if t.endswith(unit):
            try:
                return int(float(t[: -len(unit)]) * factor)
            except ValueError:
                break
    try:
        return int(t)
    except ValueError:
        raise CheckpointError(f"size {text!r} is not understood; write e.g. 2GB, 500MB or a byte count") from None
