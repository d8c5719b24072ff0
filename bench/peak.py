"""The machine's matmul throughput, measured in the run that reports "fraction of peak".

Machines differ by 3-7x (AVX-512 alone vs AMX-BF16, core counts), so a hard-coded peak says little
about another machine. Two shapes per dtype: a large square one (2048^3, what the hardware can do)
and the decode shape of a 135M-class model (64 rows x 576 x 1536: one MLP projection of a batch-64
decode step), which is what a decode step can hope for.
"""

from __future__ import annotations

import time

import torch

SHAPES = {"2048^3": (2048, 2048, 2048), "decode 64x576x1536": (64, 576, 1536)}
TINY_SHAPES = {"256^3": (256, 256, 256), "decode 8x64x128": (8, 64, 128)}


def matmul_gflops(rows: int, inner: int, cols: int, dtype: torch.dtype, seconds: float = 1.0) -> float:
    """Best GFLOP/s of ``[rows, inner] @ [inner, cols]`` over repeated timings for about ``seconds``."""
    a = torch.randn(rows, inner).to(dtype)
    b = torch.randn(inner, cols).to(dtype)
    out = torch.empty(rows, cols, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up
    flops = 2.0 * rows * inner * cols
    best, deadline = 0.0, time.perf_counter() + seconds
    repeats = max(1, int(2e8 // flops))  # ~0.2 GFLOP per timing, so a timing is not all overhead
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b, out=out)
        best = max(best, flops * repeats / (time.perf_counter() - start) / 1e9)
    return best


def measure_peaks(dtypes: list[str], shapes: dict[str, tuple[int, int, int]] = SHAPES,
                  seconds: float = 1.0) -> dict[tuple[str, str], float]:
    """``{(dtype, shape name): GFLOP/s}`` for every dtype and shape."""
    return {(dtype, name): matmul_gflops(*shape, getattr(torch, dtype), seconds)
            for dtype in dtypes for name, shape in shapes.items()}


def format_peaks(peaks: dict[tuple[str, str], float]) -> str:
    return "  ".join(f"{dtype} {name}: {value:.0f}" for (dtype, name), value in peaks.items())
