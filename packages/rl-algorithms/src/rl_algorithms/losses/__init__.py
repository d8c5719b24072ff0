"""Policy losses (one file each) and the pieces they share.

Each loss is a picklable dataclass implementing :class:`rl_core.protocols.LossFn`.
"""

from rl_algorithms.losses.clipped_pg import ClippedPolicyGradientLoss
from rl_algorithms.losses.gspo import GSPOLoss
from rl_algorithms.losses.importance_sampling import ImportanceSampling, mismatch_metrics, mismatch_per_token
from rl_algorithms.losses.kl import kl_estimate, kl_penalized_rewards
from rl_algorithms.losses.masking import loss_token_mask, make_normalizer, reduce_loss

__all__ = [
    "ClippedPolicyGradientLoss",
    "GSPOLoss",
    "ImportanceSampling",
    "kl_estimate",
    "kl_penalized_rewards",
    "loss_token_mask",
    "make_normalizer",
    "mismatch_metrics",
    "mismatch_per_token",
    "reduce_loss",
]
