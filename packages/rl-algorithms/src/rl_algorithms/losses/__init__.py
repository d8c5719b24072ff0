"""Policy losses (one file each) and the pieces they share.

Each loss is a picklable dataclass implementing :class:`rl_core.protocols.LossFn`.
"""

from rl_algorithms.losses.clipped_pg import ClippedPolicyGradientLoss, with_positive_token_count
from rl_algorithms.losses.importance_sampling import ImportanceSampling, mismatch_metrics, mismatch_per_token
from rl_algorithms.losses.kl import kl_estimate, kl_penalized_rewards
from rl_algorithms.losses.masking import loss_token_mask, make_normalizer, reduce_loss

__all__ = [
    "ClippedPolicyGradientLoss",
    "ImportanceSampling",
    "kl_estimate",
    "kl_penalized_rewards",
    "loss_token_mask",
    "make_normalizer",
    "mismatch_metrics",
    "mismatch_per_token",
    "reduce_loss",
    "with_positive_token_count",
]

# SFT, DPO, reward-model and distillation losses (issue 7).
from rl_algorithms.losses.bradley_terry import BradleyTerryLoss  # noqa: E402
from rl_algorithms.losses.distill_kl import DistillationKLLoss, topk_kl  # noqa: E402
from rl_algorithms.losses.dpo import DPOLoss  # noqa: E402
from rl_algorithms.losses.nll import NLLLoss  # noqa: E402
from rl_algorithms.losses.xtoken_kl import CrossTokenizerKLLoss, project_probs  # noqa: E402

__all__ += ["BradleyTerryLoss", "CrossTokenizerKLLoss", "DPOLoss", "DistillationKLLoss", "NLLLoss", "project_probs", "topk_kl"]
