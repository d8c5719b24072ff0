"""A training checkpoint as a Hugging Face model directory, converted once and cached next to it.

``hf_model_dir("runs/grpo")`` finds the run's latest complete checkpoint, verifies it, converts its
``policy/`` into ``<step dir>/hf/`` (atomically, under a file lock, so concurrent commands convert it
once) and returns that directory. Later calls reuse the conversion while the checkpoint is unchanged
(its manifest, or else its ``meta.json`` and DCP metadata, hash the same).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from rl_checkpoint.layout import MANIFEST_FILE, checkpoint_root, model_dir

CACHE_DIR = "hf"
SOURCE_MARKER = "rl_checkpoint_source.json"


def is_training_checkpoint(path: Path) -> bool:
    """Whether ``path`` (already through ``model_dir``) is a checkpoint of this library (meta.json + dcp/)."""
    return (path / "meta.json").is_file() and (path / "dcp").is_dir()


def hf_model_dir(path: str | Path) -> Path | None:
    """The HF directory of the training checkpoint ``path`` names (a run, ``checkpoints/``, step or
    ``policy/`` directory, or an ``hf-to-dcp`` output), converted on first use; None when ``path`` is
    not a training checkpoint. Raises CheckpointError for an incomplete or damaged one."""
    from rl_checkpoint.convert import write_hf
    from rl_checkpoint.detect import open_checkpoint

    model = model_dir(path)
    if not is_training_checkpoint(model):
        return None
    root = checkpoint_root(model)
    target = root / CACHE_DIR
    key = _source_key(root, model)
    with _locked(root / f".{CACHE_DIR}.lock"):
        if _marker(target) == key:
            return target
        opened = open_checkpoint(model)  # verifies the checksums first
        write_hf(opened.source, target, config_dir=opened.config_dir, force=True)
        (target / SOURCE_MARKER).write_text(json.dumps(key) + "\n")
    return target


def _source_key(root: Path, model: Path) -> dict:
    """What identifies the checkpoint's content cheaply: its manifest, else its metadata files."""
    digest = hashlib.sha256()
    files = [root / MANIFEST_FILE] if (root / MANIFEST_FILE).is_file() else [model / "meta.json", model / "dcp" / ".metadata"]
    for file in files:
        digest.update(file.read_bytes() if file.is_file() else b"")
    return {"source": str(model.resolve()), "sha256": digest.hexdigest()}


def _marker(target: Path) -> dict | None:
    try:
        return json.loads((target / SOURCE_MARKER).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released by the kernel if this process dies
        yield
