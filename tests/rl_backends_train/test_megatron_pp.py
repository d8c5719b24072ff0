"""Pipeline parallelism of the Megatron-core backend on CPU (gloo, megatron-core 0.16.1's 1F1B
schedule): PP=2 against PP=1 (logprobs, top-k, steps with several micro-batches, weights in HF
names), tied embeddings (a copy on the last stage; with recompute), checkpoints across pipeline
sizes, the config errors, shared-prompt packing; PP=4, PP=4 x 2 virtual stages, TP=2 x PP=2 and DP=2 x PP=2 with packing, and LoRA. The four-rank
and LoRA cases are marked ``slow`` (Ray actor start-up dominates their time on 2 cores)."""

from __future__ import annotations

import pytest
import torch
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
from safetensors.torch import load_file

from rl_backends_train import TrainBackendConfig, build_training_backend

pytest.importorskip("megatron.core")

VOCAB = 500
# 8 rows in micro-batches of 2: four micro-batches through the 1F1B schedule (warm-up, steady, cool-down).
BASE = {"optimizer": {"lr": 1e-3, "eps": 1e-3}, "reference_model": False, "micro_batch_size": 2}


def megatron(**overrides) -> TrainBackendConfig:
    """One rank in this process unless ``num_workers`` asks for Ray ranks."""
    return megatron_config(BASE, **overrides)


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory):
    """A tiny Llama whose output layer is its embedding (as SmolLM2's)."""
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-llama-tied"), family="llama", tie_word_embeddings=True))


@pytest.fixture(scope="module")
def batches(skewed_lengths):
    return make_batch(VOCAB, skewed_lengths), make_batch(VOCAB, skewed_lengths[::-1], seed=1)


def test_pipeline_2_equals_1_and_resumes_on_one_stage(ray_session, tiny_model_dir, batches, tmp_path):
    """Untied Llama, one decoder layer per stage: the first stage embeds, the last holds the final
    norm and lm_head. Its checkpoint resumes at PP=1."""
    with build_training_backend(megatron(num_workers=2, pipeline_parallel_size=2), tiny_model_dir) as policy:
        pp2 = two_steps(policy, batches, checkpoint=str(tmp_path / "ckpt"))
    with build_training_backend(megatron(), tiny_model_dir) as policy:
        pp1 = two_steps(policy, batches)
        assert policy.load(str(tmp_path / "ckpt")) == 1
        resumed = policy.train(batches[1], MaskedNLL()), dict(policy.named_weights())
    on_disk = load_file(f"{tiny_model_dir}/model.safetensors")
    assert pp2["initial"].keys() == on_disk.keys()
    for name, tensor in on_disk.items():
        assert torch.equal(pp2["initial"][name], tensor), name  # HF -> stages -> gathered HF is exact
    assert_same_run(pp2, pp1)
    assert_same_step(resumed[0], pp2["next_step"])
    assert_same_weights(resumed[1], pp2["next_weights"])


def test_tied_embeddings_over_two_stages(ray_session, tied_model_dir, batches, tmp_path):
    """The last stage's copy of the embedding gets the summed gradient of both uses, so the copies
    stay equal: two steps equal PP=1. A PP=1 checkpoint loads into the PP=2 group (both copies).
    With Megatron's full recompute on both sides (its checkpoint function inside the schedule)."""
    recompute = {"activation_checkpointing": True}
    with build_training_backend(megatron(**recompute), tied_model_dir) as policy:
        pp1 = two_steps(policy, batches, checkpoint=str(tmp_path / "ckpt"))
    pp2_cfg = megatron(num_workers=2, pipeline_parallel_size=2, **recompute)
    with build_training_backend(pp2_cfg, tied_model_dir) as policy:
        pp2 = two_steps(policy, batches)
        assert policy.load(str(tmp_path / "ckpt")) == 1
        resumed = policy.train(batches[1], MaskedNLL()), dict(policy.named_weights())
    assert "lm_head.weight" not in pp2["initial"]
    assert_same_run(pp2, pp1)
    assert_same_step(resumed[0], pp1["next_step"])
    assert_same_weights(resumed[1], pp1["next_weights"])


@pytest.mark.slow  # four Ray ranks: 18-40 s each on 2 cores
@pytest.mark.parametrize("tensor, data", [(2, 1), (1, 2)])
def test_four_ranks_with_two_stages_and_packing(ray_session, tiny_tp_dir, batches, tensor, data):
    """TP 2 x PP 2 and DP 2 x PP 2 (ranks: tp fastest, then dp, then pp): packed micro-batches
    through the pipeline (with DP 2 the shards pack into different numbers of rows: dummies fill
    up), vocab-parallel logits on the last stage, weights gathered over TP then over the stages."""
    packing = {"packing": {"enabled": True, "max_tokens_per_micro_batch": 48}, "weights_bucket_bytes": 20_000}
    cfg = megatron(num_workers=4, tensor_parallel_size=tensor, pipeline_parallel_size=2, **packing)
    assert cfg.data_parallel_size == data
    with build_training_backend(cfg, tiny_tp_dir) as policy:
        four = two_steps(policy, batches)
    with build_training_backend(megatron(**packing), tiny_tp_dir) as policy:
        one = two_steps(policy, batches)
    assert_same_run(four, one)


def test_shared_prompt_packing_over_two_stages(ray_session, tiny_model_dir):
    """GRPO-shaped batches packed with one copy of each prompt (several packed rows: several
    micro-batches through the schedule): both stages build the same packed rows and the same
    answer positions for RoPE; the run equals padded rows on one stage."""
    groups = [[5, 9, 1, 7], [12, 3, 8, 2], [4, 6, 10, 5]]
    grouped = tuple(make_grouped_batch(VOCAB, [11, 6, 17], groups, seed=s) for s in (5, 6))
    shared = {"packing": {"enabled": True, "share_prompts": True, "max_tokens_per_micro_batch": 40}}
    with build_training_backend(megatron(num_workers=2, pipeline_parallel_size=2, **shared), tiny_model_dir) as policy:
        pp2 = two_steps(policy, grouped)
    with build_training_backend(megatron(), tiny_model_dir) as policy:
        pp1 = two_steps(policy, grouped)
    assert_same_run(pp2, pp1)


@pytest.fixture(scope="module")
def four_layer_dir(tmp_path_factory):
    from rl_core.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-llama-4"), family="llama", num_hidden_layers=4))


@pytest.mark.slow  # four Ray ranks
def test_virtual_pipeline_stages(ray_session, tmp_path_factory, batches, tmp_path):
    """PP 4 x 2 virtual stages of an 8-layer model: rank r holds layers r and r + 4 (one per chunk), run
    by megatron-core's interleaved schedule; 8 rows in micro-batches of 3 make 3 micro-batches,
    topped up to 8 (a multiple of PP, at least 2 x PP) with dummies. Equal to one rank; the checkpoint
    resumes there."""
    from rl_core.models import save_tiny_model

    model_dir = str(save_tiny_model(tmp_path_factory.mktemp("tiny-llama-8"), family="llama", num_hidden_layers=8))
    cfg = megatron(num_workers=4, pipeline_parallel_size=4, virtual_pipeline_parallel_size=2, micro_batch_size=3)
    with build_training_backend(cfg, model_dir) as policy:
        vpp = two_steps(policy, batches, checkpoint=str(tmp_path / "ckpt"))
    with build_training_backend(megatron(micro_batch_size=3), model_dir) as policy:
        pp1 = two_steps(policy, batches)
        assert policy.load(str(tmp_path / "ckpt")) == 1
        resumed = policy.train(batches[1], MaskedNLL()), dict(policy.named_weights())
    assert_same_run(vpp, pp1)
    assert_same_step(resumed[0], vpp["next_step"])
    assert_same_weights(resumed[1], vpp["next_weights"])


@pytest.mark.slow  # four Ray ranks
def test_four_stages(ray_session, four_layer_dir, batches):
    """Two middle stages, which receive and send in both directions."""
    model_dir = four_layer_dir
    with build_training_backend(megatron(num_workers=4, pipeline_parallel_size=4), model_dir) as policy:
        pp4 = two_steps(policy, batches)
    with build_training_backend(megatron(), model_dir) as policy:
        pp1 = two_steps(policy, batches)
    assert_same_run(pp4, pp1)


@pytest.mark.slow  # a third pair of Ray ranks (10-17 s on 2 cores)
def test_lora_over_two_stages(ray_session, tiny_model_dir, batches, tmp_path):
    """Each stage draws the adapters of every layer in order and keeps its own: the same initial
    adapters, steps and merged weights as PP=1; save_adapter gathers the stages."""
    lora = {"lora": {"rank": 4, "alpha": 8.0}, "optimizer": {"lr": 1e-2, "eps": 1e-3}}
    with build_training_backend(megatron(num_workers=2, pipeline_parallel_size=2, **lora), tiny_model_dir) as policy:
        pp2 = two_steps(policy, batches)
        policy.save_adapter(str(tmp_path / "pp2"))
    with build_training_backend(megatron(**lora), tiny_model_dir) as policy:
        pp1 = two_steps(policy, batches)
        policy.save_adapter(str(tmp_path / "pp1"))
    assert_same_run(pp2, pp1)
    adapters_2, adapters_1 = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("pp2", "pp1"))
    assert_same_weights(adapters_2, adapters_1, atol=1e-6)


def test_pipeline_config_errors(tiny_model_dir, four_layer_dir):
    with pytest.raises(ValueError, match="pipeline_parallel_size=2 is not supported by backend=dtensor"):
        TrainBackendConfig(num_workers=2, pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="= 4 must divide num_workers=2"):
        TrainBackendConfig(backend="megatron", num_workers=2, tensor_parallel_size=2, pipeline_parallel_size=2)
    cfg = TrainBackendConfig(backend="megatron", num_workers=3, pipeline_parallel_size=3)
    assert cfg.data_parallel_size == 1
    with pytest.raises(ValueError, match="pipeline_parallel_size=3 must divide num_hidden_layers=2"):
        build_training_backend(cfg, tiny_model_dir)  # in the driver, before any worker starts
    with pytest.raises(ValueError, match="virtual_pipeline_parallel_size=2 needs pipeline_parallel_size >= 3"):
        TrainBackendConfig(backend="megatron", num_workers=2, pipeline_parallel_size=2, virtual_pipeline_parallel_size=2)
    cfg = TrainBackendConfig(backend="megatron", num_workers=4, pipeline_parallel_size=4, virtual_pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="pipeline_parallel_size=4 x virtual_pipeline_parallel_size=2 must divide "
                                         "num_hidden_layers=4"):
        build_training_backend(cfg, four_layer_dir)


def test_stage_names():
    from rl_backends_train.megatron.stages import PipelineStage

    last = PipelineStage(rank=1, size=2, layer_offset=2, num_layers=2, tied_embeddings=True)
    assert last.to_global("decoder.layers.1.mlp.linear_fc1.weight") == "decoder.layers.3.mlp.linear_fc1.weight"
    assert last.to_global("output_layer.weight") == "embedding.word_embeddings.weight"
    assert last.to_local("embedding.word_embeddings.weight") == "output_layer.weight"
    assert last.to_local("decoder.layers.1.self_attention.linear_qkv.weight") is None
    assert last.to_local("decoder.final_layernorm.weight") == "decoder.final_layernorm.weight"
    first = PipelineStage(rank=0, size=2, layer_offset=0, num_layers=2, tied_embeddings=True)
    assert first.to_local("output_layer.weight") is None
    assert first.to_global("output_layer.weight") == "output_layer.weight"
