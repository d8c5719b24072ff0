"""The native engine on every model family (tiny random models of ``rl_core.models.tiny.FAMILIES``):
the same tokens as HF ``generate``, the same logprobs as a training forward, with continuous
batching, shared-prompt prefill, refit and sleep/wake; and clear refusals for what it lacks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rl_backends_gen.hf import HFGenerationBackend
from rl_backends_gen.native import NativeEngine, recurrent
from rl_core.models.tiny import FAMILIES
from rl_core.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
RECURRENT = {"qwen3_5_text": "linear_attn", "qwen3_5_moe_text": "linear_attn", "nemotron_h": "mixer"}


def hf_model(path: str):
    """A plain HF model with transformers' default attention (GPT-OSS has no SDPA path)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(path: str, prompts):
    """HF ``generate``, one prompt at a time (no padding at all)."""
    return HFGenerationBackend(path, batch_size=1).generate(prompts, GREEDY)


def max_logprob_gap(results, prompts, training_logprobs, model, temperature: float) -> float:
    flat = [(p, c) for p, samples in zip(prompts, results) for c in samples]
    expected = training_logprobs(model, [p for p, _ in flat], [c.token_ids for _, c in flat], temperature)
    return max((torch.tensor(c.logprobs) - e).abs().max().item() for (_, c), e in zip(flat, expected))


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_hf_generate_and_logprobs_equal_training_forward(family, tiny_family_dir, tiny_prompts,
                                                                        training_logprobs):
    """Token for token HF ``generate``; logprobs (T = 1 for greedy) those of a training forward. (HF's
    own single-step Mamba-2 decode drifts ~1e-4 from its training forward; the engine's does not.)"""
    path = tiny_family_dir(family)
    got = NativeEngine(path, max_batch_size=8, max_seq_len=128).generate(tiny_prompts, GREEDY)
    want = hf_greedy(path, tiny_prompts)
    assert [r[0].token_ids for r in got] == [r[0].token_ids for r in want]
    assert [r[0].finish_reason for r in got] == [r[0].finish_reason for r in want]
    assert max_logprob_gap(got, tiny_prompts, training_logprobs, hf_model(path), 1.0) <= 1e-5
    assert sum(len(r[0].token_ids) for r in got) > 3 * len(tiny_prompts)  # not trivially short


def test_qwen2_with_sliding_window_layers_equals_hf_generate(tmp_path, tiny_prompts, training_logprobs):
    """Qwen2's optional sliding window (every layer, window 8 < the prompts' 27 and 40 tokens)."""
    from rl_core.models import save_tiny_model

    path = str(save_tiny_model(tmp_path, family="qwen2", use_sliding_window=True, sliding_window=8,
                               max_window_layers=0))
    got = NativeEngine(path, max_batch_size=8, max_seq_len=128).generate(tiny_prompts, GREEDY)
    assert [r[0].token_ids for r in got] == [r[0].token_ids for r in hf_greedy(path, tiny_prompts)]
    assert max_logprob_gap(got, tiny_prompts, training_logprobs, hf_model(path), 1.0) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_continuous_batching_logprobs_equal_training_forward(family, tiny_family_dir, tiny_prompts, training_logprobs):
    """Prompts of 40, 1, 27, 4 and 7 tokens x 3 samples through 4 rows, max_seq_len 48: the 40-token
    prompt's rows stop after 8 tokens while a later row goes on, so rows of every cache kind move into
    freed slots and new samples join; the samples equal those of a batch that holds them all at once."""
    path, prompts = tiny_family_dir(family), tiny_prompts[::-1]
    sampling = SamplingParams(max_new_tokens=20, temperature=0.8, top_p=0.95, top_k=50, n=3, seed=5)
    narrow = NativeEngine(path, max_batch_size=4, max_seq_len=48).generate(prompts, sampling)
    wide = NativeEngine(path, max_batch_size=16, max_seq_len=48).generate(prompts, sampling)
    assert [[c.token_ids for c in s] for s in narrow] == [[c.token_ids for c in s] for s in wide]
    assert max(len(c.token_ids) for c in narrow[0]) <= 8 < max(len(c.token_ids) for c in narrow[1])
    assert max_logprob_gap(narrow, prompts, training_logprobs, hf_model(path), 0.8) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prompt_prefill_equals_plain_prefill(family, tiny_family_dir, tiny_tokenizer, training_logprobs):
    """A prefix the prompts share runs once; its cache rows (keys/values, latents, recurrent and
    convolution states) are copied to every sample; the outputs do not change."""
    path = tiny_family_dir(family)
    system = tiny_tokenizer.encode("You are a careful assistant. Answer the question in one short line.")
    prompts = [system + tiny_tokenizer.encode(q) for q in ["What is 2 + 3?", "Name a colour.", "Why?", "Hi there"]]
    shared = NativeEngine(path, max_batch_size=8, max_seq_len=128)
    plain = NativeEngine(path, max_batch_size=8, max_seq_len=128, share_prompt_prefix=False)
    sampling = SamplingParams(max_new_tokens=16, temperature=0.9, n=2, seed=11)
    got, want = shared.generate(prompts, sampling), plain.generate(prompts, sampling)
    assert shared.stats.shared_prefix_tokens >= len(system) * (len(prompts) - 1)
    assert [[c.token_ids for c in s] for s in got] == [[c.token_ids for c in s] for s in want]
    assert max_logprob_gap(got, prompts, training_logprobs, hf_model(path), 0.9) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_refit_and_sleep_wake(family, tiny_family_dir, tiny_prompts, tmp_path):
    """New weights change the outputs to exactly those of an engine built from them (which the test
    above holds to HF), without reallocating the cache; sleep frees every cache buffer, wake restores."""
    path = tiny_family_dir(family)
    engine = NativeEngine(path, max_batch_size=8, max_seq_len=128)
    before = [r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)]
    buffers = [t.data_ptr() for t in engine.cache.buffers()]
    model = hf_model(path)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator) * (p.std() if p.numel() > 1 else 1.0))
    engine.update_weights(model.state_dict().items())
    after = [r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)]
    assert after != before
    assert [t.data_ptr() for t in engine.cache.buffers()] == buffers
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(path) / name, tmp_path / name)
    fresh = NativeEngine(str(tmp_path), max_batch_size=8, max_seq_len=128).generate(tiny_prompts, GREEDY)
    assert after == [r[0].token_ids for r in fresh]
    engine.sleep()
    assert engine.cache.nbytes() == 0
    engine.wake()
    assert [r[0].token_ids for r in engine.generate(tiny_prompts, GREEDY)] == after


@pytest.mark.parametrize("family", sorted(RECURRENT))
def test_recurrent_layers_decode_one_token_per_step_from_a_fixed_size_state(family, tiny_family_dir, tiny_prompts,
                                                                           monkeypatch):
    """O(1) per token: after its prefill, a recurrent mixer only ever sees the new token of each row (its
    convolution, which every forward of the mixer runs, transformers' and the direct decode's alike), and its
    cache does not grow with max_seq_len."""
    path = tiny_family_dir(family)
    engine = NativeEngine(path, max_batch_size=8, max_seq_len=128)
    index = next(i for i, c in enumerate(engine.cache.layers) if c is not None and not c.positional)
    widths: list[int] = []
    mixer = getattr(engine.decoder.layers[index], RECURRENT[family])
    convolve = recurrent.convolve

    def recorded(module, inputs, step, layer):
        if module is mixer:
            widths.append(inputs.shape[-1])  # [B, channels, q]
        return convolve(module, inputs, step, layer)

    monkeypatch.setattr(recurrent, "convolve", recorded)
    engine.generate(tiny_prompts, GREEDY)
    assert widths[0] > 1 and set(widths[1:]) == {1}
    assert len(widths) == engine.stats.prefill_forwards + engine.stats.decode_steps
    longer = NativeEngine(path, max_batch_size=8, max_seq_len=256)
    assert longer.cache.layers[index].shapes == engine.cache.layers[index].shapes


@pytest.mark.parametrize("family", ["qwen3_5_text", "glm4_moe_lite", "gpt_oss"])
def test_bfloat16_decode_is_close_to_training_forward(family, tiny_family_dir, tiny_prompts, training_logprobs):
    """bfloat16 on CPU through each decode attention kind: the hybrid's softmax layers, latent attention
    (both with the key scores read from the untransposed cache) and attention with sinks."""
    from transformers import AutoModelForCausalLM

    path = tiny_family_dir(family)
    results = NativeEngine(path, dtype="bfloat16", max_batch_size=8, max_seq_len=128).generate(
        tiny_prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    assert max_logprob_gap(results, tiny_prompts, training_logprobs, model, 1.0) <= 0.1


REFUSED = [
    ("qwen3_next", {"layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
                    "linear_num_value_heads": 2, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                    "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
                    "shared_expert_intermediate_size": 32},
     r"qwen3_next layer 0: a 'linear_attention' layer \(Qwen3NextGatedDeltaNet\).*generation.backend=vllm"),
    ("gemma2", {}, r"attn_logit_softcapping \(gemma2\); use generation.backend=vllm"),
]


@pytest.mark.parametrize("family,extra,message", REFUSED, ids=[r[0] for r in REFUSED])
def test_unsupported_layers_are_refused_naming_family_layer_and_alternative(family, extra, message, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, **extra)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(NotImplementedError, match=message):
        NativeEngine(str(tmp_path))
    # the same refusal as a config error before any engine is built (what `rl` runs before writing anything)
    from rl_backends_gen import GenerationConfig, check_generation
    from rl_core.config import ConfigError

    with pytest.raises(ConfigError, match=message) as error:
        check_generation(GenerationConfig(), str(tmp_path))
    assert [problem.key for problem in error.value.problems] == ["generation.backend"]
    check_generation(GenerationConfig(backend="hf"), str(tmp_path))  # another backend: nothing to refuse


def test_the_documented_matrix_is_the_tested_one(documented_families):
    """docs/models.md lists exactly the families tested here, each with the native engine."""
    assert set(documented_families) == set(FAMILIES)
    assert all(row["native engine"] == "yes" for row in documented_families.values())
