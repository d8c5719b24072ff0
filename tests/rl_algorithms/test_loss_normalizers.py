"""Dr. GRPO's constant reduction and the positive-sample NLL's normalisers, against closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algorithms.grpo import GRPOConfig, LossConfig
from rl_algorithms.grpo.loop import train_on_batch
from rl_algorithms.losses import ClippedPolicyGradientLoss, make_normalizer, with_positive_token_count
from rl_core.batch import split
from rl_core.types import ModelOutputs

# As in test_losses.py: two sequences of 4 positions, position 0 is the prompt; row 0 has 3 response
# tokens, row 1 has 2. Per-token clipped losses (eps 0.2): row 0 (A=1) -1.2, -0.5, -1.1; row 1 (A=-2) 1.6, 2.6.
LOSS_MASK = torch.tensor([[0.0, 1, 1, 1], [0.0, 1, 1, 0]])
RATIOS = torch.tensor([[1.0, 1.5, 0.5, 1.1], [1.0, 0.7, 1.3, 1.0]])
PREV = torch.full((2, 4), -1.0)
ADV = torch.tensor([1.0, -2.0])
CLIPPED_SUM = -1.2 - 0.5 - 1.1 + 1.6 + 2.6


def run(loss_fn, **extra):
    logprobs = (PREV + RATIOS.log()).clone().requires_grad_(True)
    batch = {"loss_mask": LOSS_MASK, "prev_logprobs": PREV, "advantages": ADV, **extra}
    loss, metrics = loss_fn(ModelOutputs(logprobs=logprobs), batch, make_normalizer(batch))
    return loss, metrics, logprobs


def test_constant_reduction_is_the_sum_over_sequences_times_the_fixed_length():
    loss, metrics, logprobs = run(ClippedPolicyGradientLoss(reduction="constant", constant_normalizer=4))
    assert loss.item() == pytest.approx(CLIPPED_SUM / (2 * 4), abs=1e-6)  # TRL: sum / (rows x max_completion_length)
    assert metrics["pg_loss"] == pytest.approx(loss.item())
    loss.backward()
    # Where the unclipped term is active its gradient is -A r, divided by the constant 2 x 4.
    expected = torch.tensor([[0, 0, -0.5, -1.1], [0, 0, 2 * 1.3, 0]]) / 8
    torch.testing.assert_close(logprobs.grad, expected, atol=1e-6, rtol=0)


def test_constant_reduction_gives_every_token_the_same_weight_whatever_its_length():
    """On-policy (ratio 1): each token's gradient is -A / (S L), not -A / (S len_i) as with sequence means."""
    logprobs = PREV.clone().requires_grad_(True)
    batch = {"loss_mask": LOSS_MASK, "advantages": torch.tensor([1.0, 1.0])}
    for reduction, row_weights in (("constant", (1 / 10, 1 / 10)), ("sequence", (1 / 6, 1 / 4))):
        logprobs.grad = None
        loss_fn = ClippedPolicyGradientLoss(reduction=reduction, constant_normalizer=5)
        loss_fn(ModelOutputs(logprobs=logprobs), batch, make_normalizer(batch))[0].backward()
        expected = -LOSS_MASK * torch.tensor(row_weights)[:, None]
        torch.testing.assert_close(logprobs.grad, expected, atol=1e-6, rtol=0)


def test_constant_reduction_counts_valid_sequences_and_applies_to_kl():
    ref = PREV + torch.tensor([[0.0, 0.5, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0]])
    loss_fn = ClippedPolicyGradientLoss(reduction="constant", constant_normalizer=4, kl_coef=0.1, kl_estimator="k1")
    # The masked sequence leaves the denominator: 1 valid sequence x 4.
    loss, metrics, _ = run(loss_fn, sample_mask=torch.tensor([1.0, 0.0]), ref_logprobs=ref)
    logp = PREV[0] + RATIOS[0].log()
    kl_sum = float((logp - ref[0])[1:].sum())  # k1 = logpi - logpi_ref on row 0's three tokens
    assert metrics["pg_loss"] == pytest.approx((-1.2 - 0.5 - 1.1) / 4, abs=1e-6)
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1) / 4 + 0.1 * kl_sum / 4, abs=1e-6)


def test_positive_nll_normalizers_closed_form():
    rewards = torch.tensor([1.0, 0.0])  # only row 0 (3 tokens) is positive
    nll_sum = -sum(-1 + math.log(r) for r in (1.5, 0.5, 1.1))
    batch_extra = {"rewards": rewards, "num_positive_tokens": torch.tensor([3.0, 3.0])}
    _, paper, _ = run(ClippedPolicyGradientLoss(positive_nll_coef=0.1), **batch_extra)
    assert paper["positive_nll"] == pytest.approx(nll_sum / 3, abs=1e-6)  # VAPO: / positive tokens
    _, all_tokens, _ = run(ClippedPolicyGradientLoss(positive_nll_coef=0.1, positive_nll_normalizer="all_tokens"),
                           **batch_extra)
    assert all_tokens["positive_nll"] == pytest.approx(nll_sum / 5, abs=1e-6)  # / every valid token
    loss, constant, _ = run(ClippedPolicyGradientLoss(positive_nll_coef=0.1, positive_nll_normalizer="all_tokens",
                                                      reduction="constant", constant_normalizer=4), **batch_extra)
    assert constant["positive_nll"] == pytest.approx(nll_sum / 8, abs=1e-6)  # reduced like the policy term
    assert loss.item() == pytest.approx(CLIPPED_SUM / 8 + 0.1 * nll_sum / 8, abs=1e-6)


def test_positive_token_count_is_the_steps_count_in_every_row():
    batch = {"loss_mask": LOSS_MASK, "rewards": torch.tensor([0.5, 1.0]), "sample_mask": torch.tensor([1.0, 0.0])}
    counted = with_positive_token_count(batch)
    assert counted["num_positive_tokens"].tolist() == [3.0, 3.0]  # row 1 is positive but masked out
    assert "num_positive_tokens" not in batch
    with pytest.raises(KeyError, match="with_positive_token_count"):
        run(ClippedPolicyGradientLoss(positive_nll_coef=0.1), rewards=torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize(("reduction", "nll_normalizer"), [
    ("constant", "positive_tokens"), ("constant", "all_tokens"), ("token", "positive_tokens"),
    ("sequence", "positive_tokens"),
])
def test_micro_batches_sum_to_the_full_batch_loss(reduction, nll_normalizer):
    g = torch.Generator().manual_seed(1)
    b, t = 6, 7
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[:, 0] = 0
    mask[4] = 0  # a sequence with no response token
    batch = with_positive_token_count({
        "loss_mask": mask,
        "sample_mask": torch.tensor([1.0, 1, 0, 1, 1, 1]),
        "advantages": torch.randn(b, generator=g),
        "prev_logprobs": -torch.rand(b, t, generator=g) * 3,
        "ref_logprobs": -torch.rand(b, t, generator=g) * 3,
        "rewards": torch.tensor([1.0, 0, 1, 1, 0, 1]),
    })
    logprobs = -torch.rand(b, t, generator=g) * 3
    loss_fn = ClippedPolicyGradientLoss(reduction=reduction, constant_normalizer=9, kl_coef=0.1,
                                        positive_nll_coef=0.3, positive_nll_normalizer=nll_normalizer)
    normalizer = make_normalizer(batch)
    full_loss, full_metrics = loss_fn(ModelOutputs(logprobs=logprobs), batch, normalizer)
    for size in (1, 2, 4):
        micro = [loss_fn(ModelOutputs(logprobs=mb.pop("logprobs")), mb, normalizer)
                 for mb in split({**batch, "logprobs": logprobs}, size)]
        assert sum(m[0] for m in micro).item() == pytest.approx(full_loss.item(), abs=1e-6)
        for key in ("pg_loss", "positive_nll"):
            assert sum(m[1][key] for m in micro) == pytest.approx(full_metrics[key], abs=1e-6), key


class RecordingPolicy:
    """Stands in for a training backend: records each optimizer step's batch."""

    def __init__(self):
        self.batches = []

    def train(self, batch, loss_fn, temperature=1.0):
        self.batches.append(batch)
        return {"loss": 0.0}


def test_each_optimizer_step_carries_its_own_positive_token_count():
    batch = {"loss_mask": torch.ones(4, 3), "rewards": torch.tensor([1.0, 0.0, 1.0, 1.0]),
             "advantages": torch.zeros(4)}
    policy = RecordingPolicy()
    cfg = GRPOConfig(batch_size=2, num_generations_per_prompt=2, num_minibatches=2, prev_logprobs="recompute")
    train_on_batch(policy, batch, LossConfig(positive_nll_coef=0.1).build(), cfg, step=0, seed=0)
    counts = sorted(float(b["num_positive_tokens"][0]) for b in policy.batches)
    positives = sorted(float((b["rewards"] > 0).sum()) * 3 for b in policy.batches)
    assert counts == positives and sum(counts) == 9.0
    policy = RecordingPolicy()
    train_on_batch(policy, batch, LossConfig().build(), cfg, step=0, seed=0)
    assert all("num_positive_tokens" not in b for b in policy.batches)  # nothing added when the loss needs none


def test_loss_config_constant_reduction_and_clip_bounds():
    with pytest.raises(ValueError, match="loss.constant_normalizer"):
        LossConfig(reduction="constant").build()
    built = LossConfig(reduction="constant", constant_normalizer=32).build()
    assert (built.reduction, built.constant_normalizer) == ("constant", 32)
    cispo = LossConfig(objective="cispo", ratio_clip_low=1.0, ratio_clip_high=4.0).build()
    assert cispo.ratio_clip_low == 1.0  # no lower bound on the truncated IS weight
    with pytest.raises(ValueError, match="constant_normalizer"):
        ClippedPolicyGradientLoss(reduction="constant")
