"""PNG plots of a metrics JSONL file (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from rl_core.logging.jsonl import read_jsonl_metrics, series


def plot_metrics(jsonl_path: str | Path, out_png: str | Path, keys: list[str]) -> Path:
    """Draw one panel per metric (x = step) from ``jsonl_path`` into ``out_png``; returns its path.

    Keys absent from the file are left out; if none is present this raises ``ValueError`` listing
    the metrics the file does hold."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = read_jsonl_metrics(jsonl_path)
    present = [key for key in keys if series(records, key)[0]]
    if not present:
        available = sorted({k for r in records for k in r} - {"step", "timestamp"})
        raise ValueError(f"none of {keys} is in {jsonl_path}; it holds: {available[:50]}")
    cols = min(len(present), 3)
    rows = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax, key in zip(axes.flat, present):
        steps, values = series(records, key)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 2.5 ticks
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present):]:
        ax.set_visible(False)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_png.parent, suffix=".png.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
        os.replace(tmp, out_png)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out_png
