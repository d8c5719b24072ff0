"""DPO and SFT losses: closed forms on hand-made logprobs, micro-batch sums equal the full batch."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from rl_algorithms.losses.dpo import DPOLoss
from rl_algorithms.losses.masking import make_normalizer
from rl_core.batch import split
from rl_core.types import ModelOutputs


def pair_batch() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Two pairs (rows 0/1 and 2/3); prompt tokens at positions 0-1, responses of 1-3 tokens."""
    logprobs = torch.tensor([
        [0.0, -9.0, -0.5, -0.25, 0.0],   # chosen 0: response at 2, 3
        [0.0, -9.0, -1.0, -2.0, -1.0],   # rejected 0: response at 2, 3, 4
        [0.0, -9.0, -0.1, 0.0, 0.0],     # chosen 1: response at 2
        [0.0, -9.0, -3.0, -1.0, 0.0],    # rejected 1: response at 2, 3
    ])
    ref = torch.tensor([
        [0.0, -1.0, -1.0, -1.0, 0.0],
        [0.0, -1.0, -1.0, -1.0, -1.0],
        [0.0, -1.0, -0.5, 0.0, 0.0],
        [0.0, -1.0, -1.0, -1.0, 0.0],
    ])
    mask = torch.tensor([
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
    ], dtype=torch.float32)
    batch = {"loss_mask": mask, "ref_logprobs": ref, "is_chosen": torch.tensor([1.0, 0.0, 1.0, 0.0]),
             "attention_mask": torch.ones(4, 5, dtype=torch.long)}
    return logprobs, batch


def test_dpo_loss_equals_closed_form_sum():
    logprobs, batch = pair_batch()
    beta, lam = 0.5, 0.3
    loss_fn = DPOLoss(beta=beta, sft_coef=lam)
    loss, metrics = loss_fn(ModelOutputs(logprobs=logprobs), batch, make_normalizer(batch))

    # rho by hand: sum over response tokens of (logpi - logpi_ref).
    rho_c = [(-0.5 + 1) + (-0.25 + 1), (-0.1 + 0.5)]          # 1.25, 0.4
    rho_r = [(-1 + 1) + (-2 + 1) + (-1 + 1), (-3 + 1) + (-1 + 1)]  # -1.0, -2.0
    dpo = [-math.log(1 / (1 + math.exp(-beta * (c - r)))) for c, r in zip(rho_c, rho_r)]
    nll = [(0.5 + 0.25) / 2, 0.1 / 1]
    expected = (sum(dpo) + lam * sum(nll)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["accuracy"] == 1.0
    assert metrics["reward_chosen"] == pytest.approx(beta * sum(rho_c) / 2, rel=1e-6)
    assert metrics["reward_rejected"] == pytest.approx(beta * sum(rho_r) / 2, rel=1e-6)
    assert metrics["reward_margin"] == pytest.approx(beta * (sum(rho_c) - sum(rho_r)) / 2, rel=1e-6)
    assert metrics["sft_nll"] == pytest.approx(sum(nll) / 2, rel=1e-6)


def test_dpo_loss_mean_reduction_and_accuracy():
    logprobs, batch = pair_batch()
    loss, metrics = DPOLoss(beta=2.0, logprob_reduction="mean")(ModelOutputs(logprobs=logprobs), batch,
                                                               make_normalizer(batch))
    rho_c = [1.25 / 2, 0.4 / 1]
    rho_r = [-1.0 / 3, -2.0 / 2]
    expected = sum(math.log1p(math.exp(-2.0 * (c - r))) for c, r in zip(rho_c, rho_r)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # Swap the pair roles of the second pair: accuracy drops to 1/2.
    flipped = logprobs.clone()
    flipped[[2, 3]] = logprobs[[3, 2]]
    batch2 = dict(batch, ref_logprobs=batch["ref_logprobs"][[0, 1, 3, 2]], loss_mask=batch["loss_mask"][[0, 1, 3, 2]])
    _, metrics = DPOLoss()(ModelOutputs(logprobs=flipped), batch2, make_normalizer(batch2))
    assert metrics["accuracy"] == 0.5


def test_dpo_micro_batches_sum_to_full_batch_and_gradients_match():
    logprobs, batch = pair_batch()
    loss_fn = DPOLoss(beta=0.7, sft_coef=0.2)
    normalizer = make_normalizer(batch)
    full_lp = logprobs.clone().requires_grad_(True)
    full, full_metrics = loss_fn(ModelOutputs(logprobs=full_lp), batch, normalizer)
    full.backward()

    micro_lp = logprobs.clone().requires_grad_(True)
    total, summed = 0.0, {}
    for rows, micro in zip(([0, 1], [2, 3]), split(batch, 2)):
        loss, metrics = loss_fn(ModelOutputs(logprobs=micro_lp[rows]), micro, normalizer)
        loss.backward()
        total += loss.item()
        for k, v in metrics.items():
            summed[k] = summed.get(k, 0.0) + v
    assert total == pytest.approx(full.item(), rel=1e-6)
    assert summed == pytest.approx(full_metrics, rel=1e-6)
    assert torch.allclose(micro_lp.grad, full_lp.grad, atol=1e-7)


def test_dpo_rejects_split_pairs_and_missing_reference():
    logprobs, batch = pair_batch()
    with pytest.raises(ValueError, match="split a pair"):
        odd = {k: v[1:] for k, v in batch.items()}
        DPOLoss()(ModelOutputs(logprobs=logprobs[1:]), odd, make_normalizer(odd))
    with pytest.raises(KeyError, match="ref_logprobs"):
        DPOLoss()(ModelOutputs(logprobs=logprobs), {k: v for k, v in batch.items() if k != "ref_logprobs"},
                  make_normalizer(batch))
    with pytest.raises(ValueError, match="beta"):
        DPOLoss(beta=0)
    assert pickle.loads(pickle.dumps(DPOLoss(beta=0.3))) == DPOLoss(beta=0.3)
