"""Mixture-of-experts models (Mixtral) on the Megatron-core backend on CPU (gloo): the HF <-> Megatron
mapping of routers and experts, steps equal to the DTensor backend (HF's own MoE), expert parallel 2
against one rank (token all-to-all between data-parallel ranks), checkpoints across EP sizes, export,
attention-only LoRA, and the config errors; ``slow``: EP 2 x PP 2 with packing."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import (
    MaskedNLL,
    assert_export_scores_like,
    assert_megatron_steps_like_dtensor,
    assert_same_run,
    assert_same_step,
    assert_same_weights,
    make_batch,
    megatron_config,
    two_steps,
)

from rl_backends_train import TrainBackendConfig, build_training_backend

pytest.importorskip("megatron.core")

VOCAB = 500
BASE = {"optimizer": {"lr": 1e-3, "eps": 1e-3}, "reference_model": False}


def megatron(**overrides) -> TrainBackendConfig:
    """One rank in this process unless ``num_workers`` asks for Ray ranks."""
    return megatron_config(BASE, **overrides)


def test_mapping_round_trip_and_steps_equal_hf_moe(tiny_mixtral_dir, skewed_lengths):
    """The per-expert files load into Megatron's router and local experts; named_weights gives HF's
    in-memory tensors (experts stacked) bit-exactly; logprobs, a step and the weights after it equal
    the DTensor backend's (transformers' Mixtral: softmax, top 2, renormalised)."""
    initial, _ = assert_megatron_steps_like_dtensor(tiny_mixtral_dir, make_batch(VOCAB, skewed_lengths), BASE)
    assert "model.layers.0.mlp.experts.gate_up_proj" in initial


def test_expert_parallel_2_equals_1_resumes_and_exports(ray_session, tiny_mixtral_dir, skewed_lengths, tmp_path):
    """Two data-parallel ranks, each holding 2 of the 4 experts of every layer: logprobs, top-k, two
    steps and weights as one rank holding all experts; the EP 2 checkpoint resumes on one rank; the
    export loads with from_pretrained and scores as the backend."""

    batches = make_batch(VOCAB, skewed_lengths), make_batch(VOCAB, skewed_lengths[::-1], seed=1)
    cfg = megatron(num_workers=2, expert_parallel_size=2, micro_batch_size=2)
    assert cfg.data_parallel_size == 2
    with build_training_backend(cfg, tiny_mixtral_dir) as policy:
        ep2 = two_steps(policy, batches, checkpoint=str(tmp_path / "ckpt"))
        policy.export_hf(str(tmp_path / "hf"))
        after = policy.logprobs(batches[1])
    with build_training_backend(megatron(micro_batch_size=2), tiny_mixtral_dir) as policy:
        ep1 = two_steps(policy, batches)
        assert policy.load(str(tmp_path / "ckpt")) == 1
        resumed = policy.train(batches[1], MaskedNLL()), dict(policy.named_weights())
    assert_same_run(ep2, ep1)
    assert_same_step(resumed[0], ep2["next_step"])
    assert_same_weights(resumed[1], ep2["next_weights"])
    assert_export_scores_like(tmp_path / "hf", batches[1], after)


@pytest.mark.slow  # four Ray ranks
def test_expert_parallel_with_pipeline_stages_and_packing(ray_session, tiny_mixtral_dir, skewed_lengths):
    """EP 2 x PP 2 (each stage's MoE layer split over its two data-parallel ranks) with packed
    micro-batches (the shards pack into different numbers of rows: dummies keep the all-to-alls
    paired): the same run as one rank."""
    batches = make_batch(VOCAB, skewed_lengths), make_batch(VOCAB, skewed_lengths[::-1], seed=1)
    packing = {"packing": {"enabled": True, "max_tokens_per_micro_batch": 48}}
    cfg = megatron(num_workers=4, expert_parallel_size=2, pipeline_parallel_size=2, **packing)
    with build_training_backend(cfg, tiny_mixtral_dir) as policy:
        four = two_steps(policy, batches)
    with build_training_backend(megatron(**packing), tiny_mixtral_dir) as policy:
        one = two_steps(policy, batches)
    assert_same_run(four, one)


def test_attention_lora_on_a_moe_model(tiny_mixtral_dir, skewed_lengths):
    """LoRA on q/v of a Mixtral: only adapters train, the merged weights differ from the base in q/v only."""
    lora = {"lora": {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}, "optimizer": {"lr": 1e-2}}
    batch = make_batch(VOCAB, skewed_lengths)
    with build_training_backend(megatron(**lora), tiny_mixtral_dir) as policy:
        before = dict(policy.named_weights())
        policy.train(batch, MaskedNLL())
        policy.train(batch, MaskedNLL())
        after = dict(policy.named_weights())
    changed = sorted(name for name in before if not torch.equal(before[name], after[name]))
    assert changed == [f"model.layers.{i}.self_attn.{p}.weight" for i in range(2) for p in ("q_proj", "v_proj")]


def test_moe_config_errors(tiny_mixtral_dir, tiny_model_dir):
    """(backend=dtensor refusing expert parallel: test_config_and_batching.py.)"""
    with pytest.raises(ValueError, match="expert_parallel_size=2 must divide the data-parallel size 1"):
        TrainBackendConfig(backend="megatron", num_workers=2, tensor_parallel_size=2, expert_parallel_size=2)
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        build_training_backend(megatron(num_workers=2, expert_parallel_size=2), tiny_model_dir)
    with pytest.raises(ValueError, match="must divide the model's 4 experts"):
        build_training_backend(megatron(num_workers=3, expert_parallel_size=3), tiny_mixtral_dir)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 with a mixture-of-experts model"):
        build_training_backend(megatron(num_workers=2, tensor_parallel_size=2), tiny_mixtral_dir)
    with pytest.raises(ValueError, match=r"lora.target_modules \['down_proj', 'gate_proj', 'up_proj'\]"):
        build_training_backend(megatron(lora={"rank": 4}), tiny_mixtral_dir)
