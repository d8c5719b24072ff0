"""Ray placement on one GPU (needs Ray; scripts/gpu_wheels.sh carries it to the device machine): two
native-engine replicas sharing the GPU (0.5 each) generate and refit like one in-process engine, and a
DTensor policy in a Ray actor with the GPU computes what the in-process one computes."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import make_batch

from rl_core.types import SamplingParams

pytestmark = pytest.mark.gpu
ray = pytest.importorskip("ray")

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def ray_one_gpu():
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=True)
    yield ray
    ray.shutdown()


def test_two_replicas_share_one_gpu(ray_one_gpu, tiny_model_dir, tiny_prompts, load_hf_model):
    from rl_backends_gen import GenerationConfig, build_generation_backend

    cfg = GenerationConfig(device="cuda", max_batch_size=8, max_seq_len=128, num_replicas=2, gpus_per_replica=0.5,
                           cpus_per_replica=1)
    local = build_generation_backend(cfg.model_copy(update={"num_replicas": 0}), tiny_model_dir)
    group = build_generation_backend(cfg, tiny_model_dir)
    try:
        sampled = SamplingParams(max_new_tokens=16, temperature=1.0, n=2, seed=5)
        for sampling in (GREEDY, sampled):
            assert ([[c.token_ids for c in r] for r in group.generate(tiny_prompts, sampling)]
                    == [[c.token_ids for c in r] for r in local.generate(tiny_prompts, sampling)])
        weights = {n: p.detach() * 1.5 for n, p in load_hf_model(tiny_model_dir).named_parameters()}
        group.update_weights(weights.items())
        local.update_weights(weights.items())
        assert ([r[0].token_ids for r in group.generate(tiny_prompts, GREEDY)]
                == [r[0].token_ids for r in local.generate(tiny_prompts, GREEDY)])
    finally:
        group.shutdown()
        local.shutdown()


def test_dtensor_policy_in_a_ray_actor_uses_the_gpu(ray_one_gpu, tiny_model_dir):
    from rl_backends_train import TrainBackendConfig, build_training_backend

    batch = make_batch(500, [12, 9, 15, 6])
    common = {"reference_model": False, "gpus_per_worker": 1, "cpus_per_worker": 1}
    with build_training_backend(TrainBackendConfig(use_ray=False, **common), tiny_model_dir) as local:
        want = local.logprobs(batch)
    with build_training_backend(TrainBackendConfig(use_ray=True, **common), tiny_model_dir) as in_ray:
        got = in_ray.logprobs(batch)
        assert ray.available_resources().get("GPU", 0.0) == 0.0  # the actor holds the one GPU
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
