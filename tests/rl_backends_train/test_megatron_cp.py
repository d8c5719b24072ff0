"""Context parallelism of the Megatron-core backend on CPU (gloo): every sequence's positions split
over two ranks (load-balanced chunks; keys and values all-gathered per layer, ``megatron/context.py``)
against one rank: padded rows of widths that do not divide by 2 x cp, shared-prompt packing,
checkpoints across CP sizes, the config errors; ``slow``: CP 2 with TP 2 or PP 2 and recompute."""

from __future__ import annotations

import pytest
from backend_testlib import (
    MaskedNLL,
    assert_same_run,
    assert_same_step,
    assert_same_weights,
    make_batch,
    make_grouped_batch,
    megatron_config,
    two_steps,
)

from rl_backends_train import TrainBackendConfig, build_training_backend

pytest.importorskip("megatron.core")

VOCAB = 500
BASE = {"optimizer": {"lr": 1e-3, "eps": 1e-3}, "reference_model": False, "micro_batch_size": 3}


def megatron(**overrides) -> TrainBackendConfig:
    """One rank in this process unless ``num_workers`` asks for Ray ranks."""
    return megatron_config(BASE, **overrides)


def test_split_covers_every_position_once():
    from rl_backends_train.megatron import context

    assert context.split_index(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert context.split_index(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert sorted(context.gathered_order(24, 3).tolist()) == list(range(24))


def test_context_parallel_2_equals_1_and_resumes_on_one_rank(ray_session, tiny_model_dir, skewed_lengths, tmp_path):
    """Padded micro-batches of 3 rows (widths padded to a multiple of 4 inside the model): logprobs,
    top-k, two steps and weights as one rank; the CP 2 checkpoint resumes on one rank."""
    batches = make_batch(VOCAB, skewed_lengths), make_batch(VOCAB, skewed_lengths[::-1], seed=1)
    with build_training_backend(megatron(num_workers=2, context_parallel_size=2), tiny_model_dir) as policy:
        cp2 = two_steps(policy, batches, checkpoint=str(tmp_path / "ckpt"))
    with build_training_backend(megatron(), tiny_model_dir) as policy:
        cp1 = two_steps(policy, batches)
        assert policy.load(str(tmp_path / "ckpt")) == 1
        resumed = policy.train(batches[1], MaskedNLL()), dict(policy.named_weights())
    assert_same_run(cp2, cp1)
    assert_same_step(resumed[0], cp2["next_step"])
    assert_same_weights(resumed[1], cp2["next_weights"])


def test_context_parallel_with_shared_prompt_packing(ray_session, tiny_model_dir):
    """Packed rows (one copy of each prompt, answers at their own positions) split over two ranks:
    the same run as padded rows on one rank."""
    groups = [[5, 9, 1, 7], [12, 3, 8, 2], [4, 6, 10, 5]]
    grouped = tuple(make_grouped_batch(VOCAB, [11, 6, 17], groups, seed=s) for s in (5, 6))
    shared = {"packing": {"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": 40}}
    with build_training_backend(megatron(num_workers=2, context_parallel_size=2, **shared), tiny_model_dir) as policy:
        cp2 = two_steps(policy, grouped)
    with build_training_backend(megatron(), tiny_model_dir) as policy:
        cp1 = two_steps(policy, grouped)
    assert_same_run(cp2, cp1)


@pytest.mark.slow  # four Ray ranks
@pytest.mark.parametrize("layout", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}])
def test_context_parallel_with_tensor_or_pipeline_parallel(ray_session, tiny_tp_dir, skewed_lengths, layout):
    """CP 2 x TP 2 and CP 2 x PP 2 (ranks: tp fastest, then cp, then dp, then pp), with Megatron's
    recompute (the gathers run again in backward): the same run as one rank."""
    batches = make_batch(VOCAB, skewed_lengths), make_batch(VOCAB, skewed_lengths[::-1], seed=1)
    cfg = megatron(num_workers=4, context_parallel_size=2, activation_checkpointing=True, **layout)
    assert cfg.data_parallel_size == 1
    with build_training_backend(cfg, tiny_tp_dir) as policy:
        four = two_steps(policy, batches)
    with build_training_backend(megatron(), tiny_tp_dir) as policy:
        one = two_steps(policy, batches)
    assert_same_run(four, one)


def test_context_parallel_config_errors():
    """(backend=dtensor refusing it: test_config_and_batching.py.)"""
    with pytest.raises(ValueError, match="context_parallel_size=2 = 4 must divide num_workers=2"):
        TrainBackendConfig(backend="megatron", num_workers=2, tensor_parallel_size=2, context_parallel_size=2)
    cfg = TrainBackendConfig(backend="megatron", num_workers=4, context_parallel_size=2)
    assert cfg.data_parallel_size == 2
