"""The native engine on CUDA (skipped without a GPU): the same function as HF and a training forward."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.hf import HFGenerationBackend
from rl_backends_gen.native import NativeEngine
from rl_core.types import SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_cuda_greedy_equals_hf_greedy(family, tiny_model_dir, tiny_qwen2_dir, tiny_prompts):
    path = tiny_model_dir if family == "llama" else tiny_qwen2_dir
    engine = NativeEngine(path, device="cuda", max_batch_size=8, max_seq_len=128)
    reference = HFGenerationBackend(path, device="cuda", batch_size=1)
    for got, want in zip(engine.generate(tiny_prompts, GREEDY), reference.generate(tiny_prompts, GREEDY)):
        assert got[0].token_ids == want[0].token_ids
        assert max(abs(a - b) for a, b in zip(got[0].logprobs, want[0].logprobs)) <= 1e-4
    engine.shutdown()


def test_cuda_sampled_logprobs_equal_a_cpu_training_forward(tiny_model_dir, tiny_prompts, training_logprobs,
                                                            load_hf_model):
    engine = NativeEngine(tiny_model_dir, device="cuda", max_batch_size=8, max_seq_len=128)
    sampling = SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, n=2, seed=3)
    results = engine.generate(tiny_prompts, sampling)
    flat = [(prompt, c) for prompt, samples in zip(tiny_prompts, results) for c in samples]
    expected = training_logprobs(load_hf_model(tiny_model_dir), [p for p, _ in flat], [c.token_ids for _, c in flat],
                                 0.7)
    assert max((torch.tensor(c.logprobs) - want).abs().max().item() for (_, c), want in zip(flat, expected)) <= 1e-4
    # the same seed gives the same samples again
    assert [[c.token_ids for c in r] for r in engine.generate(tiny_prompts, sampling)] == \
        [[c.token_ids for c in r] for r in results]
    engine.shutdown()


def test_cuda_sleep_moves_weights_and_cache_off_the_gpu(tiny_model_dir, tiny_prompts):
    engine = NativeEngine(tiny_model_dir, device="cuda", max_batch_size=16, max_seq_len=512)
    before = engine.generate(tiny_prompts, GREEDY)
    awake, cache_bytes = torch.cuda.memory_allocated(), engine.cache.nbytes()
    engine.sleep()
    assert torch.cuda.memory_allocated() <= awake - cache_bytes  # the cache and the weights left the GPU
    assert next(engine.model.parameters()).device.type == "cpu"
    engine.wake()
    assert [r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)] == [r[0].token_ids for r in before]
    engine.shutdown()
