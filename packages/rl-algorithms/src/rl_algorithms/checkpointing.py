"""Atomic, checksummed training checkpoints of one run: keep the last k and/or the best k, resume.

A checkpoint is a directory ``<dir>/step_<NNNNNN>/`` holding (layout: ``rl_checkpoint.layout``)

* ``policy/``: whatever ``TrainingBackend.save`` writes (weights, optimizer, scheduler);
* ``rng.pt``: the Python, NumPy and torch RNG states of the driver;
* ``trainer_state.json``: the step, the run id, the data position, the metrics history and anything
  else the loop wants back. A directory without it is incomplete and ignored;
* optionally, more state the loop keeps beside the policy (``files``: ``draft.pt``, the speculative draft
  that ``generation.speculative.train_draft`` trains);
* ``manifest.json``: size and sha256 of every file above (``rl_checkpoint.integrity``).

Each checkpoint is written under ``.step_<NNNNNN>.tmp``, hashed, then renamed: a run killed mid-save
leaves at worst a temporary directory that the next save removes. Checkpoints belong to the run that
wrote them (``run_id``): pruning only ever removes this run's older checkpoints, and resuming refuses a
directory holding only another run's. ``resume`` verifies a checkpoint before loading it and falls back
to the previous one, with a warning, when it is damaged.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from rl_checkpoint.errors import CheckpointError
from rl_checkpoint.integrity import verify, write_manifest
from rl_checkpoint.layout import POLICY_DIR, RNG_FILE, STATE_FILE, list_checkpoints, step_dir_name
from rl_core.config import StrictModel
from rl_core.protocols import TrainingBackend
from rl_core.seed import get_rng_state, set_rng_state

__all__ = ["STATE_FILE", "CheckpointConfig", "CheckpointError", "CheckpointManager"]

log = logging.getLogger(__name__)
_UNREADABLE = object()
"""run_id of a checkpoint whose trainer_state.json cannot be read (damaged: never pruned, tried last)."""


class CheckpointConfig(StrictModel):
    """When and where to checkpoint, which checkpoints to keep, and whether to resume."""

    enabled: bool = True
    dir: str | None = None
    """Checkpoint directory (None: <output_dir>/checkpoints)."""
    every_n_steps: int = Field(0, ge=0)
    """Save every N steps (0: only at the end, when save_at_end)."""
    save_at_end: bool = True
    keep_last: int | None = Field(2, ge=1)
    """Keep the newest k checkpoints of this run (None: keep all unless keep_best limits them)."""
    keep_best: int | None = Field(None, ge=1)
    """Also keep the best k by ``best_metric`` (None: off)."""
    best_metric: str = "val/accuracy"
    """A key of the step's metrics (checkpoints saved without it never count as best)."""
    best_mode: Literal["max", "min"] = "max"
    resume: bool = False
    """Continue from the latest intact checkpoint of this run in ``dir`` (model, optimizer, scheduler,
    data position, RNG states, step); a damaged one is skipped with a warning. Starts fresh when there
    is none."""

    @model_validator(mode="after")
    def _resume_needs_checkpoints(self) -> CheckpointConfig:
        if self.resume and not self.enabled:
            raise ValueError("checkpointing.resume=true needs checkpointing.enabled=true (a run without "
                             "checkpoints has nothing to resume from)")
        return self


@dataclass(frozen=True)
class _Found:
    step: int
    path: Path
    run_id: Any
    """The run id in its trainer_state.json (None: saved before run ids; _UNREADABLE: damaged)."""
    state: dict


class CheckpointManager:
    """Saves, prunes, verifies and finds the checkpoints of run ``run_id`` in one directory.

    ``run_id`` None: no run identity; then the checkpoints saved without one (as before run ids) are
    this run's. Checkpoints without a run id are resume candidates of every run (with a warning), but
    only a run without an id prunes them."""

    def __init__(self, cfg: CheckpointConfig, directory: str | os.PathLike, run_id: str | None = None):
        self.cfg = cfg
        self.dir = Path(directory).absolute()
        self.run_id = run_id

    def should_save(self, step: int, last_step: bool) -> bool:
        """``step`` counts completed steps (1 after the first)."""
        if not self.cfg.enabled:
            return False
        if last_step and self.cfg.save_at_end:
            return True
        return self.cfg.every_n_steps > 0 and step % self.cfg.every_n_steps == 0

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints of this run, oldest first."""
        return [(found.step, found.path) for found in self._scan() if self._is_mine(found)]

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1][1] if found else None

    def best(self) -> tuple[Path, float] | None:
        """``(path, value of best_metric)`` of this run's best checkpoint; None when ``keep_best`` is off or
        no checkpoint recorded the metric."""
        if self.cfg.keep_best is None:
            return None
        ranked = self._ranked(self._mine())
        return (ranked[0][0].path, ranked[0][1]) if ranked else None

    def check_resume(self) -> None:
        """Raise CheckpointError now, before a run writes anything, when resuming would continue another
        run (the directory holds only checkpoints of other run ids). Nothing is loaded."""
        self._resume_candidates()

    def save(self, step: int, policy: TrainingBackend, state: dict[str, Any],
             files: Mapping[str, Any] | None = None) -> Path:
        """Write checkpoint ``step`` atomically and prune this run's old ones. ``state`` must be JSON-serialisable;
        ``files``: more objects to keep, each ``torch.save``d as ``<step dir>/<name>`` (under the checksums)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._remove_temporaries()
        final = self.dir / step_dir_name(step)
        self._refuse_other_runs(final)
        tmp = self.dir / f".{final.name}.tmp"
        tmp.mkdir()
        policy.save(str(tmp / POLICY_DIR))
        torch.save(get_rng_state(), tmp / RNG_FILE)
        for name, obj in (files or {}).items():
            torch.save(obj, tmp / name)
        _write_json(tmp / STATE_FILE, {**state, "step": step, "run_id": self.run_id})
        write_manifest(tmp)  # last: it hashes every file above
        if final.exists():  # a resumed run re-saving the same step
            shutil.rmtree(final)
        os.rename(tmp, final)
        self._prune(keep=final)
        return final

    def load(self, path: str | os.PathLike, policy: TrainingBackend) -> dict[str, Any]:
        """Verify checkpoint ``path`` (checksums, or its structure when it has no manifest), then load
        weights/optimizer into ``policy`` and restore the RNG states; returns the trainer state.
        A damaged checkpoint raises CheckpointError naming the file, before anything is loaded."""
        path = Path(path)
        if not verify(path, structure_of=path / POLICY_DIR).manifest:
            log.warning("checkpoint %s has no manifest.json (saved before checksums): its structure was checked, "
                        "not its checksums", path)
        state = _read_state(path)
        rng = read_torch_file(path / RNG_FILE)
        policy.load(str(path / POLICY_DIR))
        set_rng_state(rng)
        return state

    def resume(self, policy: TrainingBackend) -> tuple[Path, dict[str, Any]] | None:
        """Load this run's newest intact checkpoint into ``policy``: ``(path, trainer state)``, or None when
        the directory holds none. A damaged checkpoint is skipped with a warning naming the bad file, and
        the one before it tried. Raises CheckpointError when every checkpoint is damaged, or when the
        directory holds only checkpoints of another run."""
        candidates = self._resume_candidates()
        problems = []
        for found in reversed(candidates):
            if found.run_id is None and self.run_id is not None:
                log.warning("checkpoint %s was saved without a run id: it cannot be checked to belong to run %s",
                            found.path, self.run_id)
            try:
                return found.path, self.load(found.path, policy)
            except CheckpointError as e:
                problems.append(str(e))
                log.warning("checkpoint %s is damaged, trying the one before it: %s", found.path, e)
        if problems:
            raise CheckpointError(f"{self.dir}: every checkpoint is damaged (newest: {problems[0]}); "
                                  "restore one from a copy, or start over in a new output directory")
        return None

    def _refuse_other_runs(self, final: Path) -> None:
        """Never replace another run's checkpoint of the same step (a run re-saving its own step may)."""
        if not (final / STATE_FILE).is_file():
            return
        try:
            owner = _read_state(final).get("run_id")
        except CheckpointError:
            return  # damaged: replacing it loses nothing
        if owner is not None and owner != self.run_id:
            raise CheckpointError(f"{final}: belongs to run {owner!r}, not to this run ({self.run_id!r}), and would "
                                  "be replaced; write this run to a new output_dir (or checkpointing.dir)")

    def _resume_candidates(self) -> list[_Found]:
        found = self._scan()
        mine = [f for f in found if f.run_id in (self.run_id, None) or f.run_id is _UNREADABLE]
        others = [f for f in found if f not in mine]
        if others and not mine:
            newest = others[-1]
            raise CheckpointError(
                f"{newest.path}: belongs to run {newest.run_id!r}, not to this run ({self.run_id!r}); resuming it "
                f"would continue another run. Write this run to a new output_dir (or checkpointing.dir), or "
                f"resume that run with its own run id")
        return mine

    def _scan(self) -> list[_Found]:
        found = []
        for step, path in list_checkpoints(self.dir):
            try:
                state = _read_state(path)
                found.append(_Found(step, path, state.get("run_id"), state))
            except CheckpointError:
                found.append(_Found(step, path, _UNREADABLE, {}))
        return found

    def _mine(self) -> list[_Found]:
        """This run's checkpoints whose trainer state reads, oldest first."""
        return [f for f in self._scan() if f.run_id is not _UNREADABLE and self._is_mine(f)]

    def _is_mine(self, found: _Found) -> bool:
        return found.run_id == self.run_id

    def _remove_temporaries(self) -> None:
        for path in self.dir.glob(".step_*.tmp"):
            shutil.rmtree(path, ignore_errors=True)

    def _prune(self, keep: Path) -> None:
        """Remove this run's checkpoints beyond keep_last / keep_best; never ``keep`` (just saved),
        another run's, or one whose trainer state cannot be read."""
        if self.cfg.keep_last is None and self.cfg.keep_best is None:
            return
        mine = self._mine()
        kept = {keep}
        if self.cfg.keep_last is not None:
            kept.update(f.path for f in mine[-self.cfg.keep_last:])
        if self.cfg.keep_best is not None:
            kept.update(f.path for f, _ in self._ranked(mine)[: self.cfg.keep_best])
        for found in mine:
            if found.path not in kept:
                shutil.rmtree(found.path, ignore_errors=True)

    def _ranked(self, found: list[_Found]) -> list[tuple[_Found, float]]:
        """The checkpoints of ``found`` that recorded ``best_metric``, best first (ties: the later step)."""
        scored = []
        for f in found:
            value = f.state.get("metrics", {}).get(self.cfg.best_metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                scored.append((f, float(value)))
        sign = 1.0 if self.cfg.best_mode == "max" else -1.0
        return sorted(scored, key=lambda fv: (sign * fv[1], fv[0].step), reverse=True)


def read_torch_file(path: Path) -> Any:
    """A file a checkpoint ``torch.save``d (tensors and plain containers only), on the CPU; a CheckpointError
    naming it when it does not load."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # torch.load raises many kinds on a bad archive
        raise CheckpointError(f"{path}: corrupt ({type(e).__name__}: {e})") from None


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path / STATE_FILE}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path / STATE_FILE}: corrupt (a JSON {type(state).__name__}, not an object)")
    return state


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
