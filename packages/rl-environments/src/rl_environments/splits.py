"""Seeded, disjoint train/validation/test splits for procedurally generated problems.

Every problem is assigned to exactly one split by a stable hash of (seed, problem key), so the
splits can never overlap whatever their sizes, and each split is generated on its own from an RNG
derived from (seed, split, name) without generating the others.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Literal, TypeVar

Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")
# Share of the problem space owned by each split, in percent (train, validation, test).
SPLIT_SHARES = {"train": (0, 90), "validation": (90, 95), "test": (95, 100)}

T = TypeVar("T")


def stable_hash(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def split_of(seed: int, key: str) -> Split:
    """The split that owns the problem ``key`` under ``seed``."""
    bucket = stable_hash("split", seed, key) % 100
    for name, (low, high) in SPLIT_SHARES.items():
        if low <= bucket < high:
            return name
    raise AssertionError(bucket)


def split_rng(seed: int, split: Split, name: str) -> random.Random:
    """The RNG that draws candidate problems for one split of one generator."""
    return random.Random(stable_hash("rng", name, seed, split))


def generate_split(
    draw: Callable[[random.Random], T],
    key: Callable[[T], str],
    *,
    seed: int,
    split: Split,
    size: int,
    name: str,
    max_attempts_per_item: int = 200,
    exhaust_ok: bool = False,
) -> list[T]:
    """``size`` distinct problems owned by ``split``: draw candidates, keep those hashed to this split
    and not seen before. When the problem space is too small for ``size``: raise ValueError, or with
    ``exhaust_ok`` return the (at least one) problems found."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    rng = split_rng(seed, split, name)
    items: list[T] = []
    seen: set[str] = set()
    budget = max_attempts_per_item * max(size, 1) + 1000
    for _ in range(budget):
        if len(items) == size:
            return items
        item = draw(rng)
        k = key(item)
        if k not in seen and split_of(seed, k) == split:
            seen.add(k)
            items.append(item)
    if len(items) == size or (exhaust_ok and items):
        return items
    raise ValueError(
        f"{name}: could only find {len(items)} distinct {split} problems of the {size} asked for; "
        "the difficulty settings allow too few problems: raise the difficulty or ask for fewer"
    )

