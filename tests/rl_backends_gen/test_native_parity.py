"""The native engine computes the same function as HF generate and as a training forward."""

from __future__ import annotations

import pytest
import torch

from rl_backends_gen.hf import HFGenerationBackend
from rl_backends_gen.native import NativeEngine
from rl_core.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_equals_hf_greedy(family, tiny_model_dir, tiny_qwen2_dir, tiny_prompts):
    path = tiny_model_dir if family == "llama" else tiny_qwen2_dir
    engine = NativeEngine(path, max_batch_size=8, max_seq_len=128)
    reference = HFGenerationBackend(path, batch_size=1)  # one prompt at a time: no padding at all
    native = engine.generate(tiny_prompts, GREEDY)
    expected = reference.generate(tiny_prompts, GREEDY)
    for got, want in zip(native, expected):
        assert got[0].token_ids == want[0].token_ids
        assert got[0].finish_reason == want[0].finish_reason
        assert got[0].text == want[0].text
        # greedy reports logprobs at T = 1
        assert max(abs(a - b) for a, b in zip(got[0].logprobs, want[0].logprobs)) <= 1e-5
    assert sum(len(r[0].token_ids) for r in native) > 3 * len(tiny_prompts)  # not trivially short


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_sampled_logprobs_equal_training_forward(family, tiny_model_dir, tiny_qwen2_dir, tiny_prompts,
                                                 training_logprobs, load_hf_model):
    path = tiny_model_dir if family == "llama" else tiny_qwen2_dir
    engine = NativeEngine(path, max_batch_size=8, max_seq_len=128)
    sampling = SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=40, n=2, seed=3)
    results = engine.generate(tiny_prompts, sampling)
    flat = [(prompt, c) for prompt, samples in zip(tiny_prompts, results) for c in samples]
    expected = training_logprobs(load_hf_model(path), [p for p, _ in flat], [c.token_ids for _, c in flat], 0.7)
    diffs = [(torch.tensor(c.logprobs) - want).abs().max().item() for (_, c), want in zip(flat, expected)]
    assert max(diffs) <= 1e-5
    assert all(len(c.logprobs) == len(c.token_ids) > 0 for _, c in flat)


def test_greedy_logprobs_equal_training_forward_at_t1(llama_engine, tiny_model_dir, tiny_prompts,
                                                      training_logprobs, load_hf_model):
    results = llama_engine.generate(tiny_prompts, GREEDY)
    expected = training_logprobs(load_hf_model(tiny_model_dir), tiny_prompts,
                                 [r[0].token_ids for r in results], 1.0)
    for r, want in zip(results, expected):
        assert (torch.tensor(r[0].logprobs) - want).abs().max().item() <= 1e-5


def test_hf_backend_logprobs_follow_the_convention(hf_llama, tiny_model_dir, tiny_prompts,
                                                   training_logprobs, load_hf_model):
    sampling = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=30, seed=1)
    results = hf_llama.generate(tiny_prompts[:3], sampling)
    expected = training_logprobs(load_hf_model(tiny_model_dir), tiny_prompts[:3],
                                 [r[0].token_ids for r in results], 0.8)
    for r, want in zip(results, expected):
        assert (torch.tensor(r[0].logprobs) - want).abs().max().item() <= 1e-5


def test_bfloat16_greedy_is_close_to_training_forward(tiny_model_dir, tiny_prompts, training_logprobs):
    from transformers import AutoModelForCausalLM

    engine = NativeEngine(tiny_model_dir, dtype="bfloat16", max_batch_size=8, max_seq_len=128)
    results = engine.generate(tiny_prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    expected = training_logprobs(model, tiny_prompts, [r[0].token_ids for r in results], 1.0)
    for r, want in zip(results, expected):
        # bf16 kernels differ between a cached decode and a full forward; the gap stays small
        assert (torch.tensor(r[0].logprobs) - want).abs().max().item() <= 0.1


def test_shared_prompt_prefix_is_computed_once_with_the_same_outputs(tiny_model_dir, tiny_tokenizer,
                                                                      training_logprobs, load_hf_model):
    """Prompts that start with the same system text: the prefix runs once, and greedy tokens, sampled
    tokens and logprobs are those of the engine without sharing, of HF greedy and of a training forward."""
    system = tiny_tokenizer.encode("You are a careful assistant. Answer the question in one short line.")
    questions = ["What is 2 + 3?", "Name a colour.", "Why is the sky blue? Explain briefly please.", "Hi"]
    prompts = [system + tiny_tokenizer.encode(q) for q in questions]
    assert len(system) >= 12
    shared = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=128)
    plain = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=128, share_prompt_prefix=False)
    got = shared.generate(prompts, GREEDY)
    assert shared.stats.shared_prefix_tokens >= len(system) * (len(prompts) - 1)
    assert plain.stats.shared_prefix_tokens == 0
    want = HFGenerationBackend(tiny_model_dir, batch_size=1).generate(prompts, GREEDY)
    for a, b in zip(got, want):
        assert a[0].token_ids == b[0].token_ids
        assert max(abs(x - y) for x, y in zip(a[0].logprobs, b[0].logprobs)) <= 1e-5
    sampling = SamplingParams(max_new_tokens=16, temperature=0.9, n=3, seed=11)
    sampled, reference = shared.generate(prompts, sampling), plain.generate(prompts, sampling)
    flat = [(p, c) for p, samples in zip(prompts, sampled) for c in samples]
    assert [c.token_ids for _, c in flat] == [c.token_ids for samples in reference for c in samples]
    expected = training_logprobs(load_hf_model(tiny_model_dir), [p for p, _ in flat], [c.token_ids for _, c in flat], 0.9)
    assert max((torch.tensor(c.logprobs) - e).abs().max().item() for (_, c), e in zip(flat, expected)) <= 1e-5
