"""Bradley-Terry loss on reward-model scores."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algorithms.losses.bradley_terry import BradleyTerryLoss
from rl_algorithms.losses.masking import make_normalizer
from rl_core.batch import split
from rl_core.types import ModelOutputs


def test_bradley_terry_closed_form_accuracy_and_micro_batches():
    scores = torch.tensor([2.0, 0.5, -1.0, 0.0, 0.3, 0.3])  # pairs: (2, .5), (-1, 0), (.3, .3)
    batch = {"loss_mask": torch.ones(6, 3), "is_chosen": torch.tensor([1.0, 0.0] * 3)}
    normalizer = make_normalizer(batch)
    loss_fn = BradleyTerryLoss(score_regularization=0.1)
    loss, metrics = loss_fn(ModelOutputs(logprobs=torch.zeros(6, 3), scores=scores), batch, normalizer)
    margins = [1.5, -1.0, 0.0]
    sums = [2.5, -1.0, 0.6]
    expected = (sum(math.log1p(math.exp(-m)) for m in margins) + 0.1 * sum(s * s for s in sums)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["accuracy"] == pytest.approx(1 / 3)  # ties do not count as correct
    assert metrics["score_margin"] == pytest.approx(sum(margins) / 3)

    total = 0.0
    for start, micro in zip((0, 2, 4), split(batch, 2)):
        part, _ = loss_fn(ModelOutputs(logprobs=torch.zeros(2, 3), scores=scores[start : start + 2]), micro, normalizer)
        total += part.item()
    assert total == pytest.approx(loss.item(), rel=1e-6)


def test_bradley_terry_needs_scores():
    batch = {"loss_mask": torch.ones(2, 3), "is_chosen": torch.tensor([1.0, 0.0])}
    with pytest.raises(ValueError, match="task=reward_model"):
        BradleyTerryLoss()(ModelOutputs(logprobs=torch.zeros(2, 3)), batch, make_normalizer(batch))
