"""DAPO's extras: overlong reward shaping, overlong filtering and dynamic sampling bookkeeping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


def overlong_penalty(response_lengths: torch.Tensor, max_response_length: int, buffer_length: int, penalty: float = 1.0) -> torch.Tensor:
    """[B] reward shaping in the buffer before the maximum length (always <= 0).

    With ``L_exp = max_response_length - buffer_length``:
    ``min(-(len - L_exp) / buffer_length * penalty, 0)``; it reaches ``-penalty`` at the max length.
    """
    if buffer_length <= 0 or buffer_length > max_response_length:
        raise ValueError(f"overlong buffer_length must be in (0, max_response_length={max_response_length}], got {buffer_length}")
    expected = max_response_length - buffer_length
    shaped = -(response_lengths.double() - expected) / buffer_length * penalty
    return shaped.clamp(max=0.0).float()


def overlong_filter(sample_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """[B] sample mask with truncated samples (hit the length limit) masked out of the loss."""
    return sample_mask * (~truncated.bool()).to(sample_mask.dtype)


def group_has_signal(rewards: Sequence[float], valid: Sequence[bool] | None = None, tol: float = 1e-9) -> bool:
    """Whether a group's valid rewards differ (otherwise every advantage of the group is 0)."""
    kept = [r for r, v in zip(rewards, valid if valid is not None else [True] * len(rewards)) if v]
    return len(kept) >= 2 and max(kept) - min(kept) > tol


@dataclass
class DynamicSamplingBuffer(Generic[T]):
    """Collects groups with a learning signal over generation rounds (DAPO dynamic sampling).

    ``add_round`` is called after each generation round with that round's groups and whether each has
    signal; groups without signal are dropped. Generation continues while :attr:`needs_more`: the
    buffer holds fewer than ``target_groups`` and fewer than ``1 + max_extra_rounds`` rounds were run.
    :meth:`take` returns at most ``target_groups`` groups, in arrival order.
    """

    target_groups: int
    max_extra_rounds: int
    kept: list[T] = field(default_factory=list)
    rounds: int = 0
    num_dropped: int = 0
    num_seen: int = 0

    def __post_init__(self) -> None:
        if self.target_groups <= 0:
            raise ValueError(f"target_groups must be > 0, got {self.target_groups}")
        if self.max_extra_rounds < 0:
            raise ValueError(f"max_extra_rounds must be >= 0, got {self.max_extra_rounds}")

    def add_round(self, groups: Sequence[T], has_signal: Sequence[bool]) -> None:
        if len(groups) != len(has_signal):
            raise ValueError(f"{len(groups)} groups but {len(has_signal)} has_signal flags")
        self.rounds += 1
        self.num_seen += len(groups)
        for group, signal in zip(groups, has_signal):
            if signal:
                self.kept.append(group)
            else:
                self.num_dropped += 1

    @property
    def is_full(self) -> bool:
        return len(self.kept) >= self.target_groups

    @property
    def needs_more(self) -> bool:
        return not self.is_full and self.rounds < 1 + self.max_extra_rounds

    def take(self) -> list[T]:
        return self.kept[: self.target_groups]

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic_sampling/rounds": float(self.rounds),
            "dynamic_sampling/kept_groups": float(min(len(self.kept), self.target_groups)),
            "dynamic_sampling/dropped_groups": float(self.num_dropped),
            "dynamic_sampling/kept_fraction": len(self.kept) / max(self.num_seen, 1),
        }
