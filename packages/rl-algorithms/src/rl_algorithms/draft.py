"""The online draft of speculative decoding (``generation.speculative.train_draft``), from the training loops.

After each step's refit, GRPO and on-policy distillation hand the step's rollouts to the generation
backend's draft trainer (a native engine in this process holds one when ``train_draft`` is on) with this
library's own distillation loss: the draft (student) is pulled towards the refitted policy (teacher) on
the policy's top-k tokens. rl-backends-gen may not import rl-algorithms, so the loss travels as an
argument. Backends without a trainer are left alone.
"""

from __future__ import annotations

from rl_algorithms.loop import Metrics
from rl_algorithms.losses.distill_kl import DistillationKLLoss
from rl_core.batch import Batch
from rl_core.protocols import GenerationBackend

# Forward KL(policy || draft) over the policy's top-k with the draft's full-vocabulary softmax: it also
# pushes the draft's mass out of tokens the policy would not pick, which is what acceptance
# (sum over tokens of min(p, q)) rewards.
DRAFT_LOSS = DistillationKLLoss(kl_type="forward", student_full_vocab=True)


def speculative_metrics(generation: GenerationBackend | None) -> Metrics:
    """A speculative native engine's acceptance metrics since the last call, as ``speculative/<name>``."""
    speculative = getattr(generation, "speculative", None)
    if speculative is None:
        return {}
    return {f"speculative/{name}": value for name, value in speculative.pop_metrics().items()}


def train_draft(generation: GenerationBackend | None, batch: Batch) -> Metrics:
    """One training step of the engine's draft on ``batch`` (the step's rollouts); ``draft/<name>`` metrics:
    ``distill_loss`` (the first pass: the gap the policy's move opened), ``distill_loss_last``, ``tokens``,
    ``train_seconds``. Empty when the backend trains no draft."""
    trainer = getattr(getattr(generation, "speculative", None), "trainer", None)
    if trainer is None:
        return {}
    return {f"draft/{name}": value for name, value in trainer.train(batch, DRAFT_LOSS).items()}
