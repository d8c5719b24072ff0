"""``cluster.malloc``: whether glibc's malloc keeps large freed blocks in a run's processes.

By default glibc serves a large allocation (above a threshold that grows to at most 32 MiB) with a
``mmap`` of its own and hands it back to the kernel on ``free``, and it trims the heap's free top;
the next allocation of that size then faults freshly zeroed pages in, one 4 KiB page at a time. A
training step on CPU allocates vocab-sized tensors for every micro-batch (the logits and their
gradient, the tied embedding's gradient: 113 MB each for SmolLM2's 49152 x 576 table), so page
faults take a large share of it. ``retain`` turns both off for the process (``mallopt``: no mmap
for large blocks, no trimming), so a freed block is reused by the next allocation: the main
recipe's training step takes 0.74x the time (docs/benchmarks.md). The cost: the process keeps
the memory of its peak. ``auto`` retains in the processes that use no GPU. The setting lasts for
the life of the process; glibc only (elsewhere nothing is changed).
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys
from typing import Literal, get_args

logger = logging.getLogger(__name__)

MallocMode = Literal["auto", "retain", "system"]
ENV_VAR = "RL_MALLOC"
"""Carries ``cluster.malloc`` to the worker processes, which apply it once they know their device."""

# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1

GLIBC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_INT_MAX)}
"""``retain`` for a process that is not ours (a child started with these in its environment: glibc reads
them at start-up), e.g. a peer engine compared on the same allocator setting."""

_retaining = False


def retains(mode: str, *, on_gpu: bool) -> bool:
    """Whether a process in ``mode`` keeps freed memory (``auto``: when it uses no GPU)."""
    if mode not in get_args(MallocMode):
        raise ValueError(f"cluster.malloc must be auto, retain or system, got {mode!r}")
    return mode == "retain" or (mode == "auto" and not on_gpu)


def apply(mode: str, *, on_gpu: bool) -> bool:
    """Set this process's malloc as ``mode`` says; True when it keeps freed memory from now on."""
    return retain_freed_memory() if retains(mode, on_gpu=on_gpu) else _retaining


def retain_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse in this process (idempotent); False where the
    C library is not glibc, or refuses, and nothing was changed."""
    global _retaining
    if _retaining:
        return True
    if not is_glibc():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        _retaining = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX) == 1
    except (OSError, AttributeError) as e:
        logger.debug("mallopt is not available (%s): malloc keeps its defaults", e)
        return False
    return _retaining


def is_glibc() -> bool:
    """Whether this process runs on Linux with glibc (the C library whose malloc this module sets)."""
    return sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


def retaining() -> bool:
    """Whether :func:`retain_freed_memory` has taken effect in this process."""
    return _retaining
