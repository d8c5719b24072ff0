"""Masked NLL (the SFT loss): the value by hand and exact micro-batch sums."""

from __future__ import annotations

import pytest
import torch

from rl_algorithms.losses.masking import make_normalizer
from rl_algorithms.losses.nll import NLLLoss
from rl_core.batch import split
from rl_core.types import ModelOutputs


def test_nll_token_and_sequence_reductions_by_hand():
    logprobs = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -0.5, -9.0, 0.0], [0.0, -4.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 0, 0]], dtype=torch.float32)
    batch = {"loss_mask": mask}
    normalizer = make_normalizer(batch)
    loss, metrics = NLLLoss()(ModelOutputs(logprobs=logprobs), batch, normalizer)
    assert loss.item() == pytest.approx((1 + 2 + 3 + 0.5 + 4) / 5)
    assert metrics["num_tokens"] == 5
    seq, _ = NLLLoss(reduction="sequence")(ModelOutputs(logprobs=logprobs), batch, normalizer)
    assert seq.item() == pytest.approx((2.0 + 0.5 + 4.0) / 3)

    for reduction in ("token", "sequence"):
        full, _ = NLLLoss(reduction=reduction)(ModelOutputs(logprobs=logprobs), batch, normalizer)
        parts = [NLLLoss(reduction=reduction)(ModelOutputs(logprobs=logprobs[i : i + 2]), micro, normalizer)[0]
                 for i, micro in zip((0, 2), split(batch, 2))]
        assert sum(p.item() for p in parts) == pytest.approx(full.item(), rel=1e-6)
