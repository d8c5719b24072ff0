"""Atomic training checkpoints: keep the last k and/or the best k, resume from the latest.

A checkpoint is a directory ``<dir>/step_<NNNNNN>/`` holding

* ``policy/``: whatever ``TrainingBackend.save`` writes (weights, optimizer, scheduler);
* ``rng.pt``: the Python, NumPy and torch RNG states of the driver;
* ``trainer_state.json``: the step, the data position, the metrics history and anything else the
  loop wants back. Written last: a directory without it is incomplete and ignored.

Each checkpoint is first written under ``.step_<NNNNNN>.tmp`` and then renamed, so a run killed
mid-save leaves at worst a temporary directory that the next save or resume removes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from rl_core.config import StrictModel
from rl_core.protocols import TrainingBackend
from rl_core.seed import get_rng_state, set_rng_state

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointConfig(StrictModel):
    """When and where to checkpoint, which checkpoints to keep, and whether to resume."""

    enabled: bool = True
    dir: str | None = None
    """Checkpoint directory (None: <output_dir>/checkpoints)."""
    every_n_steps: int = Field(0, ge=0)
    """Save every N steps (0: only at the end, when save_at_end)."""
    save_at_end: bool = True
    keep_last: int | None = Field(2, ge=1)
    """Keep the newest k checkpoints (None: keep all unless keep_best limits them)."""
    keep_best: int | None = Field(None, ge=1)
    """Also keep the best k by ``best_metric`` (None: off)."""
    best_metric: str = "val/accuracy"
    """A key of the step's metrics (checkpoints saved without it never count as best)."""
    best_mode: Literal["max", "min"] = "max"
    resume: bool = False
    """Continue from the latest complete checkpoint in ``dir`` (model, optimizer, scheduler, data
    position, RNG states, step). Starts fresh when there is none."""


class CheckpointManager:
    """Saves, prunes and finds checkpoints in one directory."""

    def __init__(self, cfg: CheckpointConfig, directory: str | os.PathLike):
        self.cfg = cfg
        self.dir = Path(directory).absolute()

    def should_save(self, step: int, last_step: bool) -> bool:
        """``step`` counts completed steps (1 after the first)."""
        if not self.cfg.enabled:
            return False
        if last_step and self.cfg.save_at_end:
            return True
        return self.cfg.every_n_steps > 0 and step % self.cfg.every_n_steps == 0

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first."""
        if not self.dir.is_dir():
            return []
        found = []
        for path in self.dir.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and (path / STATE_FILE).is_file():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1][1] if found else None

    def save(self, step: int, policy: TrainingBackend, state: dict[str, Any]) -> Path:
        """Write checkpoint ``step`` atomically and prune old ones. ``state`` must be JSON-serialisable."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._remove_temporaries()
        final = self.dir / f"step_{step:06d}"
        tmp = self.dir / f".step_{step:06d}.tmp"
        tmp.mkdir()
        policy.save(str(tmp / "policy"))
        torch.save(get_rng_state(), tmp / "rng.pt")
        _write_json(tmp / STATE_FILE, {**state, "step": step})
        if final.exists():  # a resumed run re-saving the same step
            shutil.rmtree(final)
        os.rename(tmp, final)
        self._prune()
        return final

    def load(self, path: str | os.PathLike, policy: TrainingBackend) -> dict[str, Any]:
        """Load weights/optimizer into ``policy``, restore the RNG states; returns the trainer state."""
        path = Path(path)
        policy.load(str(path / "policy"))
        set_rng_state(torch.load(path / "rng.pt", weights_only=True))
        return json.loads((path / STATE_FILE).read_text())

    def _remove_temporaries(self) -> None:
        for path in self.dir.glob(".step_*.tmp"):
            shutil.rmtree(path, ignore_errors=True)

    def _prune(self) -> None:
        found = self.checkpoints()
        if self.cfg.keep_last is None and self.cfg.keep_best is None:
            return
        keep: set[Path] = set()
        if self.cfg.keep_last is not None:
            keep.update(path for _, path in found[-self.cfg.keep_last:])
        if self.cfg.keep_best is not None:
            keep.update(self._best(found))
        for _, path in found:
            if path not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def _best(self, found: list[tuple[int, Path]]) -> list[Path]:
        scored = []
        for step, path in found:
            value = json.loads((path / STATE_FILE).read_text()).get("metrics", {}).get(self.cfg.best_metric)
            if isinstance(value, (int, float)):
                scored.append((value if self.cfg.best_mode == "max" else -value, step, path))
        scored.sort(reverse=True)
        return [path for _, _, path in scored[: self.cfg.keep_best]]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
