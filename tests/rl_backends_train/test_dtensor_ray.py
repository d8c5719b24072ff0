"""The DTensor backend over Ray: FSDP2 data parallel and tensor parallel equal one worker; DCP
checkpoints reshard; a failing rank surfaces in the driver instead of hanging."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import FailsOnRank1, MaskedNLL, make_batch, make_grouped_batch

from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.cluster import WorkerError

VOCAB = 500
SMOOTH_ADAM = {"lr": 1e-3, "eps": 1e-3}  # see test_dtensor_local.py


def cfg(**overrides) -> TrainBackendConfig:
    return TrainBackendConfig(**({"optimizer": SMOOTH_ADAM, "reference_model": False} | overrides))


def one_step(model_dir, batch, **overrides):
    with build_training_backend(cfg(**overrides), model_dir) as policy:
        before = policy.logprobs(batch)
        metrics = policy.train(batch, MaskedNLL())
        return before, metrics, dict(policy.named_weights()), policy.logprobs(batch)


def assert_same_step(a, b, atol=1e-6):
    before_a, metrics_a, weights_a, after_a = a
    before_b, metrics_b, weights_b, after_b = b
    torch.testing.assert_close(before_a, before_b, rtol=0, atol=1e-5)
    assert metrics_a["loss"] == pytest.approx(metrics_b["loss"], rel=1e-6)
    assert metrics_a["grad_norm"] == pytest.approx(metrics_b["grad_norm"], rel=1e-5)
    assert metrics_a["num_valid_tokens"] == metrics_b["num_valid_tokens"]
    for name in weights_a:
        torch.testing.assert_close(weights_a[name], weights_b[name], rtol=0, atol=atol, msg=name)
    torch.testing.assert_close(after_a, after_b, rtol=0, atol=1e-5)


def test_two_fsdp_workers_equal_one_worker_and_their_checkpoint_loads_into_one(
        ray_session, tiny_model_dir, skewed_lengths, tmp_path):
    # Rows 0-3 (long) go to rank 0 and rows 4-7 (short) to rank 1: with packing, the ranks plan
    # different numbers of micro-batches and the short one must pad with dummies to stay in step.
    batch, next_batch = make_batch(VOCAB, skewed_lengths), make_batch(VOCAB, skewed_lengths, seed=1)
    single = one_step(tiny_model_dir, batch, use_ray=False, micro_batch_size=4)
    packing = {"enabled": True, "max_tokens_per_micro_batch": 40}
    with build_training_backend(cfg(num_workers=2, packing=packing), tiny_model_dir) as policy:
        before = policy.logprobs(batch)
        metrics = policy.train(batch, MaskedNLL())
        double = (before, metrics, dict(policy.named_weights()), policy.logprobs(batch))
        policy.save(str(tmp_path / "ckpt"))
        expected_next = policy.train(next_batch, MaskedNLL())
        expected_weights = dict(policy.named_weights())
    assert_same_step(single, double)

    # DCP reshards the 2-rank FSDP checkpoint onto one rank.
    with build_training_backend(cfg(use_ray=False), tiny_model_dir) as resumed:
        assert resumed.load(str(tmp_path / "ckpt")) == 1
        next_step = resumed.train(next_batch, MaskedNLL())
        weights = dict(resumed.named_weights())
    assert next_step["loss"] == pytest.approx(expected_next["loss"], rel=1e-6)
    for name in expected_weights:
        torch.testing.assert_close(weights[name], expected_weights[name], rtol=0, atol=1e-6, msg=name)


def test_tensor_parallel_2_equals_1(ray_session, tiny_tp_dir, skewed_lengths):
    batch = make_batch(VOCAB, skewed_lengths[:4])
    single = one_step(tiny_tp_dir, batch, use_ray=False)
    tp2 = one_step(tiny_tp_dir, batch, num_workers=2, tensor_parallel_size=2)
    assert_same_step(single, tp2, atol=1e-5)


def test_sequence_parallel_2_equals_1(ray_session, tiny_tp_dir, skewed_lengths):
    """TP=2 with the norms and residual stream sharded on the sequence: same logprobs before and
    after one step, same loss, grad norm and weights as one rank. Micro-batches of 2 rows have
    widths 40 and 33, so the odd one is split unevenly (17 + 16 positions)."""
    batch = make_batch(VOCAB, skewed_lengths[:4])
    single = one_step(tiny_tp_dir, batch, use_ray=False, micro_batch_size=2)
    sequence_parallel = one_step(tiny_tp_dir, batch, num_workers=2, tensor_parallel_size=2, sequence_parallel=True,
                                 micro_batch_size=2)
    assert_same_step(single, sequence_parallel, atol=1e-5)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallel_with_shared_prompt_packing_equals_padded(ray_session, tiny_tp_dir, sequence_parallel):
    """TP=2 (and + SP) with prompts packed once per group: the padded single-rank step."""
    batch = make_grouped_batch(VOCAB, [9, 6], [[4, 7, 3], [5, 2, 8]], seed=4)
    single = one_step(tiny_tp_dir, batch, use_ray=False)
    packing = {"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": 24}
    tp2 = one_step(tiny_tp_dir, batch, num_workers=2, tensor_parallel_size=2, sequence_parallel=sequence_parallel,
                   packing=packing)
    assert_same_step(single, tp2, atol=1e-5)


def test_a_rank_that_raises_does_not_hang_the_driver(ray_session, tiny_model_dir, skewed_lengths):
    policy = build_training_backend(cfg(num_workers=2), tiny_model_dir)
    try:
        # Rank 0 goes on into backward and waits for rank 1's gradients, which never come.
        with pytest.raises(WorkerError, match="rank 1 gives up") as info:
            policy.train(make_batch(VOCAB, skewed_lengths), FailsOnRank1())
        assert info.value.rank == 1
    finally:
        policy.shutdown()
