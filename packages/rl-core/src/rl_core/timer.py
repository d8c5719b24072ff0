"""Wall-clock time per phase of a step: ``with timer.time("generate"): ...``, then ``timer.pop()``."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Timer:
    """Accumulates seconds per named phase until ``pop()`` hands them over and starts afresh.

    A phase timed twice before ``pop()`` adds up. ``pop()`` also reports ``time/total``: the seconds
    since the previous ``pop()`` (or construction), which includes time spent outside any phase.
    """

    def __init__(self, prefix: str = "time/"):
        self.prefix = prefix
        self._seconds: dict[str, float] = defaultdict(float)
        self._since = time.perf_counter()

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        """Time the body of the ``with`` block as ``phase`` (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[phase] += time.perf_counter() - start

    def add(self, phase: str, seconds: float) -> None:
        """Add seconds measured elsewhere (for example by a worker) to ``phase``."""
        self._seconds[phase] += seconds

    def peek(self) -> dict[str, float]:
        """Seconds per phase so far, without resetting (keys without the prefix)."""
        return dict(self._seconds)

    def pop(self) -> dict[str, float]:
        """``{"time/<phase>": seconds, ..., "time/total": seconds}`` since the last pop; then reset."""
        now = time.perf_counter()
        out = {f"{self.prefix}{phase}": seconds for phase, seconds in self._seconds.items()}
        out[f"{self.prefix}total"] = now - self._since
        self._seconds.clear()
        self._since = now
        return out
