"""Atomic output directories and config/tokenizer copying."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from rl_checkpoint.errors import CheckpointError

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".distcp")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, force: bool) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; on success it becomes ``out`` in one rename.

    A failed conversion removes the temporary directory; a killed one leaves only a hidden
    ``.<name>.tmp-*`` sibling, never a half-written ``out``."""
    out = Path(out)
    if out.exists() and not force:
        raise CheckpointError(f"{out}: already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
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


def copy_config_files(src: Path | None, dst: Path) -> list[str]:
    """Copy config, generation config, tokenizer and chat-template files (never weights)."""
    if src is None or not src.is_dir():
        return []
    copied = []
    for item in sorted(src.iterdir()):
        if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name not in _WEIGHT_INDEXES \
                and not item.name.startswith(".") and item.name not in ("meta.json", "adapter_config.json"):
            shutil.copy2(item, dst / item.name)
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
