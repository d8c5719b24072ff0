"""The online draft of speculative decoding (``generation.speculative.train_draft``), from the training loops.

After each step's refit, GRPO and on-policy distillation hand the step's rollouts to the generation
backend's draft trainer (a native engine in this process holds one when ``train_draft`` is on) with this
library's own distillation loss: the draft (student) is pulled towards the refitted policy (teacher) on
the policy's top-k tokens. rl-backends-gen may not import rl-algorithms, so the loss travels as an
argument. Backends without a trainer are left alone.

The draft belongs to the run like the policy: every training checkpoint keeps its own parameters and
AdamW state (``draft.pt`` in the step directory, under the checkpoint's checksums) and a resumed run goes
on with them; at the end the run writes it as an HF model, ``<output_dir>/draft``, for
``generation.speculative.draft_model`` of a later run or of vLLM.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_algorithms.checkpointing import read_torch_file
from rl_algorithms.losses.distill_kl import DistillationKLLoss
from rl_checkpoint.errors import CheckpointError
from rl_core.batch import Batch
from rl_core.protocols import GenerationBackend

if TYPE_CHECKING:  # rl_algorithms.loop imports this module
    from rl_algorithms.loop import Metrics

log = logging.getLogger(__name__)
DRAFT_FILE = "draft.pt"
"""The draft's state in a training checkpoint's step directory."""

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
    trainer = draft_trainer(generation)
    if trainer is None:
        return {}
    return {f"draft/{name}": value for name, value in trainer.train(batch, DRAFT_LOSS).items()}


def draft_trainer(generation: GenerationBackend | None) -> Any | None:
    """The backend's draft trainer (``generation.speculative.train_draft`` on a native engine in this process)."""
    return getattr(getattr(generation, "speculative", None), "trainer", None)


def draft_files(generation: GenerationBackend | None) -> dict[str, dict]:
    """What a training checkpoint adds for the draft: ``{DRAFT_FILE: state}`` (empty without a trainer)."""
    trainer = draft_trainer(generation)
    return {} if trainer is None else {DRAFT_FILE: trainer.state_dict()}


def restore_draft(generation: GenerationBackend | None, checkpoint: Path) -> None:
    """Load the draft saved in ``checkpoint`` (verified with it) into the backend's trainer. A checkpoint saved
    without one leaves the draft as built, with a warning; a draft the config no longer trains is ignored."""
    trainer = draft_trainer(generation)
    if trainer is None:
        return
    path = Path(checkpoint) / DRAFT_FILE
    if not path.is_file():
        log.warning("checkpoint %s holds no speculative draft (saved without train_draft): the draft starts "
                    "from generation.speculative.draft_model again", checkpoint)
        return
    state = read_torch_file(path)
    try:
        trainer.load_state_dict(state)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


def export_draft(generation: GenerationBackend | None, path: Path) -> Path | None:
    """Write the trained draft as an HF model directory at ``path``; None (nothing written) without one."""
    trainer = draft_trainer(generation)
    return None if trainer is None else trainer.save_hf(path)
