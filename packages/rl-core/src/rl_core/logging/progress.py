"""The terminal view of a run, fed by every ``MetricsLogger.log`` call (so every loop gets it).

The metric names say what a call is: ``train/*`` metrics are a training step (the bar moves to that
step), ``val/*`` metrics a validation (a line); others (``time/*``, ``epoch``) only go to the files.
It does not matter whether a loop logs them in one call (names already prefixed) or one call each.
"""

from __future__ import annotations

import math
import os
import sys
from typing import TextIO


def interactive(stream: TextIO) -> bool:
    """A live display only on a terminal and outside CI (``CI`` set to anything but false/0/no)."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class ProgressDisplay:
    """On a terminal: one bar over the steps (``step 3/10``, elapsed, ETA, rate) whose postfix holds
    the latest value of each of ``keys``; each validation is a line written above it. Elsewhere (a
    file, a pipe, CI) or with ``live=False``: one plain line per training step and per validation.

    Args:
        total_steps: the bar's length (None: no total, no ETA).
        keys: metrics (full names) shown for a training step.
        stream: where to write (default: ``sys.stdout`` at construction).
        live: force the bar on or off; None: on exactly when ``interactive(stream)``.
    """

    def __init__(self, total_steps: int | None, keys: list[str], stream: TextIO | None = None,
                 live: bool | None = None):
        self.stream = stream or sys.stdout
        self.total_steps = total_steps
        self.keys = list(keys)
        self.live = interactive(self.stream) if live is None else live
        self._bar = None
        self._latest: dict[str, float] = {}  # the key metrics seen so far (a validation's stay shown)

    def update(self, scalars: dict[str, float], step: int) -> None:
        val = {k.removeprefix("val/"): v for k, v in scalars.items() if k.startswith("val/")}
        self._latest.update({k: scalars[k] for k in self.keys if k in scalars})
        if any(k.startswith("train/") for k in scalars):
            if self.live:
                self._advance(step)
            else:
                shown = {k: scalars[k] for k in self.keys if k.startswith("train/") and k in scalars}
                self._line(f"{self._where(step)} [train] {_pairs(shown)}")
        if val:
            self._line(f"{self._where(step)} [val] {_pairs(val)}")
            if self._bar is not None:
                self._bar.set_postfix_str(_pairs(self._latest), refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _advance(self, step: int) -> None:
        if self._bar is None:
            from tqdm import tqdm

            # Starts at the step before the first one shown: a resumed run's rate and ETA count
            # only the steps this process runs.
            start = max(step - 1, 0)
            self._bar = tqdm(total=self.total_steps, initial=start, file=self.stream, desc="step",
                             unit="step", dynamic_ncols=True, smoothing=0.1, mininterval=0.5)
        if step > self._bar.n:
            self._bar.update(step - self._bar.n)
        self._bar.set_postfix_str(_pairs(self._latest), refresh=True)

    def _line(self, text: str) -> None:
        text = text.rstrip()
        if self._bar is not None:
            self._bar.write(text, file=self.stream)  # clears the bar, writes the line, redraws the bar
        else:
            print(text, file=self.stream, flush=True)

    def _where(self, step: int) -> str:
        return f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"


def _pairs(metrics: dict[str, float]) -> str:
    """``name=value`` pairs; a ``train/`` prefix is dropped (the bar and the line are about training)."""
    return " ".join(f"{k.removeprefix('train/')}={_fmt(v)}" for k, v in metrics.items())


def _fmt(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.4g}"
