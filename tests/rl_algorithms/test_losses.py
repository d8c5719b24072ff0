"""Policy losses against hand-computed values on small tensors."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from rl_algorithms.grpo import LossConfig
from rl_algorithms.losses import (
    ClippedPolicyGradientLoss,
    ImportanceSampling,
    kl_estimate,
    kl_penalized_rewards,
    make_normalizer,
    mismatch_metrics,
)
from rl_core.batch import split
from rl_core.protocols import LossFn
from rl_core.types import ModelOutputs

# Two sequences of 4 positions; position 0 is the prompt. Row 0 has 3 response tokens, row 1 has 2.
LOSS_MASK = torch.tensor([[0.0, 1, 1, 1], [0.0, 1, 1, 0]])
RATIOS = torch.tensor([[1.0, 1.5, 0.5, 1.1], [1.0, 0.7, 1.3, 1.0]])
PREV = torch.full((2, 4), -1.0)
ADV = torch.tensor([1.0, -2.0])


def make_case(**extra):
    logprobs = (PREV + RATIOS.log()).clone().requires_grad_(True)
    batch = {"loss_mask": LOSS_MASK, "prev_logprobs": PREV, "advantages": ADV, **extra}
    return ModelOutputs(logprobs=logprobs), batch


def run(loss_fn, **extra):
    outputs, batch = make_case(**extra)
    loss, metrics = loss_fn(outputs, batch, make_normalizer(batch))
    return loss, metrics, outputs.logprobs


def test_is_a_picklable_lossfn():
    loss_fn = ClippedPolicyGradientLoss(importance_sampling=ImportanceSampling())
    assert isinstance(loss_fn, LossFn) and loss_fn.needs_logits is False
    assert pickle.loads(pickle.dumps(loss_fn)) == loss_fn


def test_without_prev_logprobs_pi_old_is_the_detached_forward():
    """One on-policy update: ratio 1 everywhere, nothing clipped, gradient -A / tokens per token."""
    outputs, batch = make_case()
    del batch["prev_logprobs"]
    loss, metrics = ClippedPolicyGradientLoss()(outputs, batch, make_normalizer(batch))
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clip_fraction"] == 0.0
    assert loss.item() == pytest.approx((-1.0 * 3 + 2.0 * 2) / 5, abs=1e-6)
    loss.backward()
    expected = -ADV[:, None] * LOSS_MASK / 5
    torch.testing.assert_close(outputs.logprobs.grad, expected, atol=1e-6, rtol=0)
    assert "prev_logprobs" not in batch  # the caller's batch is left as it was


def test_clipped_token_level():
    # row 0 (A=1): max(-r, -clip(r)) = -1.2, -0.5, -1.1; row 1 (A=-2): max(2r, 2clip(r)) = 1.6, 2.6
    loss, metrics, logprobs = run(ClippedPolicyGradientLoss())
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1 + 1.6 + 2.6) / 5, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(4 / 5)  # 1.5, 0.5, 0.7, 1.3 lie outside [0.8, 1.2]
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.7 + 1.3) / 5, abs=1e-6)
    loss.backward()
    # d/dlogp of -A r is -A r where the unclipped term is active, 0 where clipped.
    expected = torch.tensor([[0, 0, -0.5, -1.1], [0, 0, 2 * 1.3, 0]]) / 5
    torch.testing.assert_close(logprobs.grad, expected, atol=1e-6, rtol=0)


def test_clipped_sequence_level():
    loss, _, _ = run(ClippedPolicyGradientLoss(reduction="sequence"))
    row0, row1 = (-1.2 - 0.5 - 1.1) / 3, (1.6 + 2.6) / 2
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)


def test_clip_higher():
    # eps_high 0.28: r=1.5 with A=1 clips at 1.28; r=1.3 with A=-2 keeps 2.6 > 2.56.
    loss, _, _ = run(ClippedPolicyGradientLoss(ratio_clip_low=0.2, ratio_clip_high=0.28))
    assert loss.item() == pytest.approx((-1.28 - 0.5 - 1.1 + 1.6 + 2.6) / 5, abs=1e-6)


def test_dual_clip():
    # c = 1.25 bounds the A=-2 tokens at 2.5: 2.6 -> 2.5, 1.6 stays.
    loss, metrics, _ = run(ClippedPolicyGradientLoss(dual_clip=1.25))
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1 + 1.6 + 2.5) / 5, abs=1e-6)
    assert metrics["dual_clip_fraction"] == pytest.approx(1 / 5)


def test_reinforce_has_no_ratio():
    loss, _, logprobs = run(ClippedPolicyGradientLoss(objective="reinforce"))
    lp = [[-1 + math.log(1.5), -1 + math.log(0.5), -1 + math.log(1.1)], [-1 + math.log(0.7), -1 + math.log(1.3)]]
    expected = (-1.0 * sum(lp[0]) + 2.0 * sum(lp[1])) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0, -1, -1, -1], [0, 2, 2, 0]]) / 5.0)


def test_cispo_detaches_the_clipped_ratio():
    loss, _, logprobs = run(ClippedPolicyGradientLoss(objective="cispo"))
    clipped = [[1.2, 0.8, 1.1], [0.8, 1.2]]
    lp = [[-1 + math.log(1.5), -1 + math.log(0.5), -1 + math.log(1.1)], [-1 + math.log(0.7), -1 + math.log(1.3)]]
    expected = (-sum(c * v for c, v in zip(clipped[0], lp[0])) + 2 * sum(c * v for c, v in zip(clipped[1], lp[1]))) / 5
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0, -1.2, -0.8, -1.1], [0, 1.6, 2.4, 0]]) / 5.0)


def test_gspo_sequence_ratio():
    s0 = (1.5 * 0.5 * 1.1) ** (1 / 3)  # exp(mean log-ratio) = geometric mean of the token ratios
    s1 = (0.7 * 1.3) ** 0.5
    loss, metrics, logprobs = run(LossConfig(kind="gspo").build())
    # eps (3e-4, 4e-4): row 0 (A=1) max(-s0, -0.9997) = -s0; row 1 (A=-2) max(2 s1, 2 * 0.9997) = 1.9994.
    assert loss.item() == pytest.approx((-s0 + 2 * 0.9997) / 2, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((3 * s0 + 2 * s1) / 5, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(1.0)
    loss.backward()
    # d(-s0)/dlogp_t = -s0 / 3 for each of row 0's tokens, averaged over 2 sequences; row 1 is clipped.
    expected = torch.tensor([[0, -s0 / 3, -s0 / 3, -s0 / 3], [0, 0, 0, 0]]) / 2
    torch.testing.assert_close(logprobs.grad, expected, atol=1e-6, rtol=0)


def test_gspo_with_wide_clip_matches_sequence_ratio_by_hand():
    s0 = (1.5 * 0.5 * 1.1) ** (1 / 3)
    s1 = (0.7 * 1.3) ** 0.5
    loss, _, _ = run(LossConfig(kind="gspo", ratio_clip_low=0.5, ratio_clip_high=0.5).build())
    assert loss.item() == pytest.approx((-s0 + 2 * s1) / 2, abs=1e-6)


def test_kl_estimators_and_clamps():
    logprobs = torch.tensor([[0.0, 0.0, 0.0]])
    ref = torch.tensor([[0.5, -1.0, 25.0]])  # log(ref/theta) = 0.5, -1, 25 (-> clamped to 20)
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k1"), torch.tensor([[-0.5, 1.0, -10.0]]))
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k2"), torch.tensor([[0.125, 0.5, 10.0]]))
    k3 = [math.exp(0.5) - 1.5, math.exp(-1.0), 10.0]
    torch.testing.assert_close(kl_estimate(logprobs, ref, "k3"), torch.tensor([k3]))
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(logprobs, ref, "k4")


def test_kl_in_loss():
    ref = PREV + torch.tensor([[0.0, 0.1, 0.2, 0.0], [0.0, -0.3, 0.0, 0.0]])
    loss, metrics, _ = run(ClippedPolicyGradientLoss(kl_coef=0.5, kl_estimator="k3"), ref_logprobs=ref)
    log_r = [0.1 - math.log(1.5), 0.2 - math.log(0.5), -math.log(1.1), -0.3 - math.log(0.7), -math.log(1.3)]
    kl = sum(math.exp(x) - 1 - x for x in log_r) / 5
    assert metrics["kl"] == pytest.approx(kl, abs=1e-6)
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1 + 1.6 + 2.6) / 5 + 0.5 * kl, abs=1e-6)


def test_kl_coef_needs_reference():
    with pytest.raises(KeyError, match="ref_logprobs"):
        run(ClippedPolicyGradientLoss(kl_coef=0.1))
    assert ClippedPolicyGradientLoss().needs_reference is False


def test_kl_in_reward():
    rewards = torch.tensor([1.0, 0.0])
    ref = PREV + torch.tensor([[9.0, 0.5, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0]])
    shaped = kl_penalized_rewards(rewards, PREV, ref, LOSS_MASK, coef=0.1, estimator="k1")
    # k1 = logpi - logpi_ref, summed over each response: row 0 -0.5 (position 0 is masked), row 1 +1.
    torch.testing.assert_close(shaped, torch.tensor([1.0 + 0.05, 0.0 - 0.1]))


def test_positive_nll():
    rewards = torch.tensor([1.0, 0.0])
    loss, metrics, _ = run(ClippedPolicyGradientLoss(positive_nll_coef=0.1, positive_nll_normalizer="all_tokens"),
                           rewards=rewards)
    nll = -sum(-1 + math.log(r) for r in (1.5, 0.5, 1.1)) / 5  # only row 0 has reward > 0, / all 5 tokens
    assert metrics["positive_nll"] == pytest.approx(nll, abs=1e-6)
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1 + 1.6 + 2.6) / 5 + 0.1 * nll, abs=1e-6)


def test_sample_mask_and_per_token_advantages():
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, -2.0, -2.0, 0.0]])
    loss, _, _ = run(ClippedPolicyGradientLoss(), sample_mask=torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1) / 3, abs=1e-6)
    outputs, batch = make_case()
    batch["advantages"] = adv
    loss2, _ = ClippedPolicyGradientLoss()(outputs, batch, make_normalizer(batch))
    assert loss2.item() == pytest.approx((-1.2 - 0.5 - 1.1 + 1.6 + 2.6) / 5, abs=1e-6)


def test_importance_sampling_token_truncated():
    # w = exp(prev - gen): row 0 = 3 (-> 2), 0.5, 1; row 1 = 1, 1.
    gen = PREV - torch.tensor([[0.0, math.log(3.0), math.log(0.5), 0.0], [0.0, 0.0, 0.0, 0.0]])
    loss, metrics, _ = run(ClippedPolicyGradientLoss(importance_sampling=ImportanceSampling(weight_max=2.0)), gen_logprobs=gen)
    assert loss.item() == pytest.approx((-1.2 * 2 - 0.5 * 0.5 - 1.1 + 1.6 + 2.6) / 5, abs=1e-6)
    assert metrics["is_weight_mean"] == pytest.approx((2 + 0.5 + 1 + 1 + 1) / 5, abs=1e-6)
    assert metrics["token_mult_prob_error"] == pytest.approx((3 + 2 + 1 + 1 + 1) / 5, abs=1e-5)
    gen_kl = ((3 - 1 - math.log(3)) + (0.5 - 1 - math.log(0.5))) / 5
    assert metrics["gen_kl_error"] == pytest.approx(gen_kl, abs=1e-6)


def test_importance_sampling_icepop_masks_out_of_range_tokens():
    gen = PREV - torch.tensor([[0.0, math.log(3.0), math.log(0.5), 0.0], [0.0, 0.0, 0.0, 0.0]])
    icepop = ImportanceSampling(truncation="mask", weight_min=0.6, weight_max=2.0)
    loss, metrics, _ = run(ClippedPolicyGradientLoss(importance_sampling=icepop), gen_logprobs=gen)
    # Tokens with w = 3 and w = 0.5 are dropped; the denominator stays the global 5 tokens.
    assert loss.item() == pytest.approx((-1.1 + 1.6 + 2.6) / 5, abs=1e-6)
    assert metrics["is_masked_fraction"] == pytest.approx(2 / 5)


def test_importance_sampling_sequence_level():
    gen = PREV - torch.tensor([[0.0, math.log(3.0), math.log(0.5), 0.0], [0.0, 0.0, math.log(0.9), 0.0]])
    is_seq = ImportanceSampling(level="sequence", truncation="clamp", weight_max=10.0)
    loss, _, _ = run(ClippedPolicyGradientLoss(importance_sampling=is_seq), gen_logprobs=gen)
    # Sequence weights: 3 * 0.5 * 1 = 1.5 and 0.9.
    assert loss.item() == pytest.approx((1.5 * (-1.2 - 0.5 - 1.1) + 0.9 * (1.6 + 2.6)) / 5, abs=1e-6)


def test_importance_sampling_sequence_mask_by_geometric_mean():
    gen = PREV - torch.tensor([[0.0, math.log(3.0), math.log(0.5), 0.0], [0.0, 0.0, math.log(0.9), 0.0]])
    # Geometric means: row 0 (1.5)^(1/3) = 1.1447, row 1 (0.9)^(1/2) = 0.9487. Keep [0.95, 1.2] -> only row 0.
    is_mask = ImportanceSampling(truncation="none", seq_mask_low=0.95, seq_mask_high=1.2)
    loss, _, _ = run(ClippedPolicyGradientLoss(importance_sampling=is_mask), gen_logprobs=gen)
    assert loss.item() == pytest.approx((3 * -1.2 + 0.5 * -0.5 + 1 * -1.1) / 5, abs=1e-6)


def test_mismatch_metrics_perfect_agreement():
    metrics = mismatch_metrics(PREV, PREV.clone(), LOSS_MASK)
    assert metrics["token_mult_prob_error"] == 1.0 and metrics["gen_kl_error"] == 0.0


def test_entropy_metric():
    outputs, batch = make_case()
    outputs.entropy = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 4.0, 5.0, 9.0]])
    _, metrics = ClippedPolicyGradientLoss()(outputs, batch, make_normalizer(batch))
    assert metrics["entropy"] == pytest.approx(3.0)


@pytest.mark.parametrize("reduction", ["token", "sequence"])
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_micro_batches_sum_to_the_full_batch_loss(reduction, ratio_level):
    g = torch.Generator().manual_seed(0)
    b, t = 6, 7
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[:, 0] = 0
    mask[4] = 0  # a sequence with no response token
    batch = {
        "loss_mask": mask,
        "sample_mask": torch.tensor([1.0, 1, 0, 1, 1, 1]),
        "advantages": torch.randn(b, generator=g),
        "prev_logprobs": -torch.rand(b, t, generator=g) * 3,
        "gen_logprobs": -torch.rand(b, t, generator=g) * 3,
        "ref_logprobs": -torch.rand(b, t, generator=g) * 3,
        "rewards": torch.tensor([1.0, 0, 1, 0, 1, 1]),
    }
    logprobs = -torch.rand(b, t, generator=g) * 3
    loss_fn = ClippedPolicyGradientLoss(
        reduction=reduction, ratio_level=ratio_level, kl_coef=0.1, positive_nll_coef=0.2,
        positive_nll_normalizer="all_tokens", dual_clip=3.0,
        importance_sampling=ImportanceSampling(weight_max=2.0),
    )
    normalizer = make_normalizer(batch)
    assert normalizer.num_valid_sequences == 4
    full_loss, full_metrics = loss_fn(ModelOutputs(logprobs=logprobs), batch, normalizer)
    micro = [loss_fn(ModelOutputs(logprobs=mb.pop("logprobs")), mb, normalizer)
             for mb in split({**batch, "logprobs": logprobs}, 2)]
    assert sum(m[0] for m in micro).item() == pytest.approx(full_loss.item(), abs=1e-6)
    for key, value in full_metrics.items():
        assert sum(m[1][key] for m in micro) == pytest.approx(value, abs=1e-6), key


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ClippedPolicyGradientLoss(dual_clip=0.5)
    with pytest.raises(ValueError, match="sequence-level"):
        ClippedPolicyGradientLoss(objective="reinforce", ratio_level="sequence")
    with pytest.raises(ValueError, match="weight_min"):
        ImportanceSampling(weight_min=3.0, weight_max=2.0)
