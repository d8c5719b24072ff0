"""GSPO: the clipped loss on the sequence-level ratio ``s_i = exp(mean_t (logpi_theta - logpi_old))``.

Same switches as :class:`ClippedPolicyGradientLoss`; only the defaults differ: the ratio and the
reduction are sequence-level and the clip range is the GSPO paper's (3e-4, 4e-4), because a
length-normalised sequence ratio moves far less than a token ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl_algorithms.losses.clipped_pg import ClippedPolicyGradientLoss
from rl_algorithms.losses.masking import Reduction


@dataclass
class GSPOLoss(ClippedPolicyGradientLoss):
    """Group Sequence Policy Optimisation loss (a picklable LossFn)."""

    ratio_clip_low: float = 3e-4
    ratio_clip_high: float = 4e-4
    ratio_level: Literal["token", "sequence"] = "sequence"
    reduction: Reduction = "sequence"
