"""Config validation, the factory, and data-parallel replicas in Ray."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rl_backends_gen import GenerationConfig, build_generation_backend
from rl_backends_gen.hf import HFGenerationBackend
from rl_backends_gen.native import NativeEngine
from rl_backends_gen.ray_group import _split
from rl_core.types import SamplingParams


def test_config_is_strict():
    with pytest.raises(ValidationError, match="extra"):
        GenerationConfig(backend="native", max_batch_sise=4)
    with pytest.raises(ValidationError, match="backend"):
        GenerationConfig(backend="tgi")
    with pytest.raises(ValidationError, match="max_batch_size"):
        GenerationConfig(max_batch_size=0)
    with pytest.raises(ValidationError, match="gpu_memory_utilization"):
        GenerationConfig(vllm={"gpu_memory_utilization": 1.5})
    assert GenerationConfig().backend == "native"


def test_factory_builds_in_process_backends(tiny_model_dir):
    native = build_generation_backend(GenerationConfig(max_batch_size=3, max_seq_len=64), tiny_model_dir)
    assert isinstance(native, NativeEngine) and native.max_batch_size == 3 and native.max_seq_len == 64
    hf = build_generation_backend(GenerationConfig(backend="hf"), tiny_model_dir)
    assert isinstance(hf, HFGenerationBackend)


def test_split_covers_every_prompt_once():
    assert _split(5, 2) == [(0, 3), (3, 5)]
    assert _split(1, 3) == [(0, 1), (1, 1), (1, 1)]


def test_two_ray_replicas_match_in_process(ray_session, tiny_model_dir, tiny_prompts, load_hf_model):
    cfg = GenerationConfig(max_batch_size=4, max_seq_len=128, num_replicas=2, cpus_per_replica=1)
    local = build_generation_backend(cfg.model_copy(update={"num_replicas": 0}), tiny_model_dir)
    group = build_generation_backend(cfg, tiny_model_dir)
    try:
        for sampling in (SamplingParams(max_new_tokens=12, temperature=0.0),
                         SamplingParams(max_new_tokens=12, temperature=1.0, n=2, seed=5)):
            want = [[c.token_ids for c in r] for r in local.generate(tiny_prompts, sampling)]
            got = [[c.token_ids for c in r] for r in group.generate(tiny_prompts, sampling)]
            assert got == want
        # refit reaches every replica
        model = load_hf_model(tiny_model_dir)
        weights = {n: p.detach() * 1.5 for n, p in model.named_parameters()}
        group.update_weights(weights.items())
        local.update_weights(weights.items())
        greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
        assert ([r[0].token_ids for r in group.generate(tiny_prompts, greedy)]
                == [r[0].token_ids for r in local.generate(tiny_prompts, greedy)])
        group.sleep()
        group.wake()
        assert len(group.generate(tiny_prompts[:1], greedy)) == 1
    finally:
        group.shutdown()
