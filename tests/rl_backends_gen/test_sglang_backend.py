"""SGLang backend: the missing-extra error on CPU; real engine tests need CUDA."""

from __future__ import annotations

import importlib.util

import pytest

from rl_core.types import SamplingParams

HAS_SGLANG = importlib.util.find_spec("sglang") is not None


@pytest.mark.skipif(HAS_SGLANG, reason="sglang is installed")
def test_missing_sglang_names_the_extra(tiny_model_dir):
    from rl_backends_gen.sglang_backend import SglangBackend

    with pytest.raises(ImportError, match=r'rl-backends-gen\[sglang\]'):
        SglangBackend(tiny_model_dir)


def test_sglang_on_cpu_is_refused_by_the_factory(tiny_model_dir):
    from rl_backends_gen import GenerationConfig, build_generation_backend

    with pytest.raises((ValueError, ImportError), match="sglang"):
        build_generation_backend(GenerationConfig(backend="sglang", device="cpu"), tiny_model_dir)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_SGLANG, reason='needs "rl-backends-gen[sglang]"')
def test_sglang_greedy_equals_hf_and_refit_changes_outputs(tiny_model_dir, tiny_prompts, load_hf_model):
    from rl_backends_gen.hf import HFGenerationBackend
    from rl_backends_gen.sglang_backend import SglangBackend

    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    backend = SglangBackend(tiny_model_dir, dtype="float32", mem_fraction_static=0.3)
    try:
        reference = HFGenerationBackend(tiny_model_dir, batch_size=1)
        before = [r[0].token_ids for r in backend.generate(tiny_prompts, greedy)]
        assert before == [r[0].token_ids for r in reference.generate(tiny_prompts, greedy)]
        weights = {n: p.detach() * 1.5 for n, p in load_hf_model(tiny_model_dir).named_parameters()}
        backend.update_weights(weights.items())
        reference.update_weights(weights.items())
        after = [r[0].token_ids for r in backend.generate(tiny_prompts, greedy)]
        assert after != before
        assert after == [r[0].token_ids for r in reference.generate(tiny_prompts, greedy)]
        backend.sleep()
        backend.wake()
        assert backend.generate(tiny_prompts[:1], greedy)[0][0].token_ids == after[0]
    finally:
        backend.shutdown()
