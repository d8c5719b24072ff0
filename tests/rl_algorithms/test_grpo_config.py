"""GRPO configs, presets' switches and the prompt stream (no model needed)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rl_algorithms.grpo import GRPOConfig, LossConfig, PromptStream
from rl_algorithms.grpo.rollouts import step_seed
from rl_algorithms.losses import ClippedPolicyGradientLoss
from rl_core.types import PromptSample


def test_loss_config_builds_each_variant():
    grpo = LossConfig().build()
    assert type(grpo) is ClippedPolicyGradientLoss and grpo.ratio_level == "token"
    gspo = LossConfig(kind="gspo", ratio_clip_low=3e-4, ratio_clip_high=4e-4, reduction="sequence").build()
    assert type(gspo) is ClippedPolicyGradientLoss and gspo.ratio_level == "sequence" and gspo.reduction == "sequence"
    tis = LossConfig(importance_sampling={"truncation": "mask", "weight_min": 0.5}).build()
    assert tis.importance_sampling.truncation == "mask" and tis.importance_sampling.weight_min == 0.5
    # KL in the reward: the loss itself carries no KL term and needs no reference in the loss.
    in_reward = LossConfig(kl_coef=0.1, kl_in_reward=True)
    assert in_reward.build().kl_coef == 0.0 and in_reward.needs_reference


def test_gspo_alone_gets_its_own_defaults():
    """`loss.kind=gspo` with nothing else: GSPO's clip range and sequence reduction, not clipped PG's."""
    from rl_core.config import dump_config, load_config

    alone = LossConfig(kind="gspo").build()
    assert (alone.ratio_clip_low, alone.ratio_clip_high, alone.reduction, alone.ratio_level) == (
        3e-4, 4e-4, "sequence", "sequence")
    # A value the config sets wins over the kind's default; the other defaults still apply.
    wide = LossConfig(kind="gspo", ratio_clip_high=0.5).build()
    assert (wide.ratio_clip_low, wide.ratio_clip_high, wide.reduction) == (3e-4, 0.5, "sequence")
    assert LossConfig(kind="gspo", reduction="token").build().reduction == "token"
    # The same from an override; the resolved config shows the values that run.
    cfg = load_config(LossConfig, None, ["kind=gspo"])
    assert (cfg.ratio_clip_low, cfg.ratio_clip_high, cfg.reduction) == (3e-4, 4e-4, "sequence")
    assert "ratio_clip_low: 0.0003" in dump_config(cfg)
    assert LossConfig().build().ratio_clip_low == 0.2


def test_bad_configs_are_rejected():
    with pytest.raises(ValidationError, match="gdpo_weights"):
        GRPOConfig(advantage={"estimator": "gdpo"})
    with pytest.raises(ValidationError, match="overlong_buffer_length"):
        GRPOConfig(max_new_tokens=16, dapo={"overlong_buffer_length": 32})
    with pytest.raises(ValidationError, match="num_minibatches"):
        GRPOConfig(batch_size=3, num_generations_per_prompt=3, num_minibatches=2)
    with pytest.raises(ValidationError, match="extra"):
        GRPOConfig(num_prompt_per_step=3)
    with pytest.raises(ValidationError, match="training_forward needs one optimizer step"):
        GRPOConfig(prev_logprobs="training_forward", num_epochs=2)
    with pytest.raises(ValidationError, match="gspo"):
        LossConfig(kind="gspo", objective="cispo")


def test_prev_logprobs_pass_only_when_needed():
    single, two_epochs = GRPOConfig(), GRPOConfig(num_epochs=2)
    assert not single.recompute_prev_logprobs(LossConfig())
    assert single.recompute_prev_logprobs(LossConfig(kl_coef=0.1, kl_in_reward=True))
    assert two_epochs.recompute_prev_logprobs(LossConfig())
    assert GRPOConfig(prev_logprobs="recompute").recompute_prev_logprobs(LossConfig())


def samples(n):
    return [PromptSample(messages=[{"role": "user", "content": str(i)}]) for i in range(n)]


def test_prompt_stream_is_seeded_and_resumable():
    data = samples(5)
    stream = PromptStream(data, seed=3)
    first = [s.messages[0]["content"] for s in stream.take(7)]  # crosses into epoch 1
    assert sorted(first[:5]) == ["0", "1", "2", "3", "4"] and stream.epoch == 1
    resumed = PromptStream(data, seed=3)
    resumed.load_state_dict(stream.state_dict())
    again = PromptStream(data, seed=3)
    again.take(7)
    assert [s.messages[0]["content"] for s in resumed.take(6)] == [s.messages[0]["content"] for s in again.take(6)]
    with pytest.raises(ValueError, match="same data"):
        PromptStream(samples(4), seed=3).load_state_dict(stream.state_dict())


def test_step_seeds_do_not_collide():
    seeds = {step_seed(0, step, r) + i for step in range(50) for r in range(4) for i in range(64)}
    assert len(seeds) == 50 * 4 * 64
