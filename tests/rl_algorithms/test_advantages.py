"""Advantage estimators and DAPO shaping against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rl_algorithms.advantages import (
    DynamicSamplingBuffer,
    clip_advantages,
    gdpo_advantages,
    group_advantages,
    group_has_signal,
    overlong_filter,
    overlong_penalty,
    reinforce_pp_advantages,
)

S3 = 1 / math.sqrt(3)  # Bessel std of [1, 0, 0, 1]


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def test_group_mean_baseline_with_std():
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1])
    groups = torch.tensor([7, 7, 7, 7, 3, 3, 3, 9])  # ids need not be dense
    # group 7: mean 0.5, Bessel std sqrt(1/3); group 3: no spread; group 9: a single sample -> 0.
    close(group_advantages(rewards, groups), [0.5 / S3, -0.5 / S3, -0.5 / S3, 0.5 / S3, 0, 0, 0, 0])


def test_dr_grpo_no_std():
    rewards = torch.tensor([1.0, 0, 0, 1, 2, 2, 5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    # group 1: mean 3 -> -1, -1, 2
    close(group_advantages(rewards, groups, normalize_std=False), [0.5, -0.5, -0.5, 0.5, -1, -1, 2])


def test_leave_one_out_baseline():
    rewards = torch.tensor([1.0, 0, 0, 1])
    groups = torch.zeros(4, dtype=torch.long)
    # r=1: others [0, 0, 1] mean 1/3, Bessel std sqrt(1/3); r=0: others [1, 0, 1] mean 2/3, same std.
    close(group_advantages(rewards, groups, baseline="leave_one_out", normalize_std=False), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    close(group_advantages(rewards, groups, baseline="leave_one_out"), [(2 / 3) / S3, -(2 / 3) / S3, -(2 / 3) / S3, (2 / 3) / S3])


def test_leave_one_out_two_samples_has_no_std():
    close(group_advantages(torch.tensor([3.0, 1.0]), torch.tensor([0, 0]), baseline="leave_one_out"), [2.0, -2.0])


def test_invalid_samples_are_left_out():
    rewards = torch.tensor([1.0, 0.0, 5.0, 1.0, 7.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    valid = torch.tensor([True, True, False, True, False])
    # group 0 over [1, 0]: mean 0.5, std sqrt(0.5); group 1 has one valid sample -> 0.
    h = 0.5 / math.sqrt(0.5)
    close(group_advantages(rewards, groups, valid), [h, -h, 0, 0, 0])


def test_gdpo_per_component_then_batch_renormalised():
    groups = torch.tensor([0, 0, 1, 1])
    components = {"correct": torch.tensor([1.0, 0, 1, 1]), "format": torch.tensor([1.0, 1, 0, 1])}
    advantages = gdpo_advantages(components, {"correct": 1.0, "format": 0.5}, groups)
    # Within groups: correct -> [.7071, -.7071, 0, 0]; format -> [0, 0, -.7071, .7071].
    # Weighted sum [.7071, -.7071, -.3536, .3536]: mean 0, Bessel std sqrt(1.25 / 3).
    std = math.sqrt(1.25 / 3)
    h = math.sqrt(0.5)
    close(advantages, [h / std, -h / std, -0.5 * h / std, 0.5 * h / std])
    assert advantages.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert advantages.std().item() == pytest.approx(1.0, abs=1e-5)


def test_gdpo_names_missing_component():
    with pytest.raises(KeyError, match="length"):
        gdpo_advantages({"correct": torch.ones(2)}, {"length": 1.0}, torch.tensor([0, 0]))


def test_reinforce_pp_group_baseline_then_token_whitening():
    rewards = torch.tensor([1.0, 0, 1, 1])
    groups = torch.tensor([0, 0, 1, 1])
    mask = torch.tensor([[0.0, 1, 1], [0, 1, 0], [0, 0, 1], [0, 0, 0]])
    # Centred per sample [.5, -.5, 0, 0]; tokens .5, .5, -.5, 0: mean .125, Bessel std sqrt(.6875 / 3).
    std = math.sqrt(0.6875 / 3)
    a, b, c = 0.375 / std, -0.625 / std, -0.125 / std
    close(reinforce_pp_advantages(rewards, groups, mask), [[0, a, a], [0, b, 0], [0, 0, c], [0, 0, 0]])


def test_clip_advantages():
    close(clip_advantages(torch.tensor([-3.0, 0.5, 4.0]), -1.0, 2.0), [-1.0, 0.5, 2.0])
    close(clip_advantages(torch.tensor([-3.0, 4.0]), None, 2.0), [-3.0, 2.0])


def test_overlong_penalty():
    # L_max 20, buffer 5 -> L_exp 15: no penalty up to 15, linear to -penalty at 20.
    close(overlong_penalty(torch.tensor([10, 15, 16, 20]), 20, 5, penalty=1.0), [0, 0, -0.2, -1.0])
    close(overlong_penalty(torch.tensor([18]), 20, 4, penalty=0.5), [-0.25])
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(torch.tensor([1]), 20, 0)


def test_overlong_filter():
    close(overlong_filter(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([False, True, True])), [1.0, 0.0, 0.0])


def test_group_has_signal():
    assert group_has_signal([1.0, 0.0, 1.0])
    assert not group_has_signal([1.0, 1.0, 1.0])
    assert not group_has_signal([1.0, 0.0], valid=[True, False])
    assert not group_has_signal([0.5])


def test_dynamic_sampling_fills_the_batch():
    buffer = DynamicSamplingBuffer(target_groups=3, max_extra_rounds=2)
    buffer.add_round(["a", "b", "c", "d"], [True, False, False, True])
    assert buffer.needs_more and len(buffer.kept) == 2
    buffer.add_round(["e", "f"], [False, False])
    assert buffer.needs_more and buffer.rounds == 2
    buffer.add_round(["g", "h"], [True, True])
    assert buffer.is_full and not buffer.needs_more
    assert buffer.take() == ["a", "d", "g"]
    m = buffer.metrics()
    assert m["dynamic_sampling/rounds"] == 3 and m["dynamic_sampling/dropped_groups"] == 4
    assert m["dynamic_sampling/kept_fraction"] == pytest.approx(4 / 8)


def test_dynamic_sampling_stops_after_max_extra_rounds():
    buffer = DynamicSamplingBuffer(target_groups=3, max_extra_rounds=1)
    buffer.add_round(["a", "b"], [True, False])
    assert buffer.needs_more
    buffer.add_round(["c", "d"], [False, False])
    assert not buffer.needs_more and not buffer.is_full
    assert buffer.take() == ["a"]
    with pytest.raises(ValueError, match="target_groups"):
        DynamicSamplingBuffer(target_groups=0, max_extra_rounds=1)
