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


def test_cuda_bf16_decode_follows_an_hf_bf16_forward(tiny_model_dir, tiny_prompts):
    """bf16 greedy decode (bf16 KV cache, SDPA over it) checked token by token against one HF bf16 forward
    over prompt + completion: each chosen token is HF's argmax up to bf16 rounding, and its logprob
    agrees with HF's."""
    from transformers import AutoModelForCausalLM

    engine = NativeEngine(tiny_model_dir, dtype="bfloat16", device="cuda", max_batch_size=8, max_seq_len=128)
    results = engine.generate(tiny_prompts, GREEDY)
    engine.shutdown()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").to("cuda").eval()
    worst_gap, worst_logprob = 0.0, 0.0
    for prompt, (completion,) in zip(tiny_prompts, results):
        ids = torch.tensor([list(prompt) + completion.token_ids], device="cuda")
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
        steps = logprobs[len(prompt) - 1 : len(prompt) - 1 + len(completion.token_ids)]  # [new, V]
        chosen = steps.gather(-1, torch.tensor(completion.token_ids, device="cuda")[:, None])[:, 0]
        worst_gap = max(worst_gap, float((steps.max(-1).values - chosen).max()))  # 0 when HF agrees exactly
        worst_logprob = max(worst_logprob, float((chosen.cpu() - torch.tensor(completion.logprobs)).abs().max()))
    print(f"bf16 decode vs HF bf16 forward: argmax gap <= {worst_gap:.2e}, |logprob diff| <= {worst_logprob:.2e}")
    assert worst_gap <= 3e-2 and worst_logprob <= 3e-2
