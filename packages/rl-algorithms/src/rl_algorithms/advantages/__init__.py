"""Advantage estimators (group baselines, GDPO, REINFORCE++) and DAPO's reward/mask shaping."""

from rl_algorithms.advantages.dapo import DynamicSamplingBuffer, group_has_signal, overlong_filter, overlong_penalty
from rl_algorithms.advantages.group import (
    clip_advantages,
    gdpo_advantages,
    group_advantages,
    reinforce_pp_advantages,
    whiten,
)

__all__ = [
    "DynamicSamplingBuffer",
    "clip_advantages",
    "gdpo_advantages",
    "group_advantages",
    "group_has_signal",
    "overlong_filter",
    "overlong_penalty",
    "reinforce_pp_advantages",
    "whiten",
]
