"""The on-disk layout of a training run, and how a path given by a user finds the model in it.

A run directory (``output_dir``) holds ``checkpoints/step_<NNNNNN>/``; each step directory holds::

    policy/               the training backend's checkpoint: dcp/ + hf_config/ + trainer_state/ + meta.json
    rng.pt                the driver's RNG states
    trainer_state.json    step, data position, metrics, run_id; a step directory without it is incomplete
    draft.pt              with generation.speculative.train_draft: the speculative draft's own weights and AdamW state
    manifest.json         size and sha256 of every file above (see rl_checkpoint.integrity)

Every command that takes a model accepts the run directory (its latest complete checkpoint), the
``checkpoints/`` directory, a step directory, or its ``policy/``.
"""

from __future__ import annotations

import re
from pathlib import Path

from rl_checkpoint.errors import CheckpointError

STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
POLICY_DIR = "policy"
RNG_FILE = "rng.pt"
CHECKPOINTS_DIR = "checkpoints"
STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def is_step_dir(path: Path) -> bool:
    return bool(STEP_DIR.match(path.name)) and path.is_dir()


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (step directories holding ``trainer_state.json``) of ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = STEP_DIR.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _latest_in(directory: Path) -> Path:
    found = list_checkpoints(directory)
    if not found:
        raise CheckpointError(f"{directory}: holds no complete checkpoint (no step_*/ with {STATE_FILE}); "
                              "every save was interrupted, or the run saved none")
    return found[-1][1]


def _holds_step_dirs(directory: Path) -> bool:
    return any(is_step_dir(p) for p in directory.iterdir())


def model_dir(path: str | Path) -> Path:
    """The directory to read a model from: ``policy/`` of the checkpoint ``path`` names (run directory ->
    its latest complete checkpoint; ``checkpoints/`` -> likewise; step directory -> its ``policy/``), or
    ``path`` itself when it is not part of a run's layout."""
    path = Path(path)
    if not path.is_dir():
        return path
    if STEP_DIR.match(path.name) and not (path / STATE_FILE).is_file() and (path / POLICY_DIR).exists():
        raise CheckpointError(f"{path}: incomplete checkpoint (no {STATE_FILE}: its save was interrupted); "
                              f"use an earlier step of {path.parent}")
    if (path / STATE_FILE).is_file() and (path / POLICY_DIR).is_dir():
        return path / POLICY_DIR
    if (path / CHECKPOINTS_DIR).is_dir() and _holds_step_dirs(path / CHECKPOINTS_DIR):
        return _latest_in(path / CHECKPOINTS_DIR) / POLICY_DIR
    if _holds_step_dirs(path):
        return _latest_in(path) / POLICY_DIR
    return path


def checkpoint_root(model: Path) -> Path:
    """The directory whose ``manifest.json`` covers ``model``: its step directory for a ``policy/``,
    else ``model`` itself (an ``hf-to-dcp`` output, or a checkpoint without a manifest)."""
    parent = model.parent
    if model.name == POLICY_DIR and (parent / STATE_FILE).is_file():
        return parent
    return model


def previous_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint saved before step directory ``root`` (for error messages), if any."""
    match = STEP_DIR.match(root.name)
    if not match:
        return None
    older = [p for step, p in list_checkpoints(root.parent) if step < int(match.group(1))]
    return older[-1] if older else None
