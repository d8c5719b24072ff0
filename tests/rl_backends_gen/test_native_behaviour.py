"""Scheduling, sampling, stopping and lifecycle of the native engine."""

from __future__ import annotations

import dataclasses

import pytest

from rl_backends_gen.native import NativeEngine
from rl_core.protocols import GenerationBackend
from rl_core.types import SamplingParams

SAMPLED = SamplingParams(max_new_tokens=10, temperature=0.9, top_p=0.95, n=2, seed=11)


def tokens(results):
    return [[c.token_ids for c in samples] for samples in results]


def test_implements_the_protocol(llama_engine):
    assert isinstance(llama_engine, GenerationBackend)


def test_seeded_sampling_does_not_depend_on_batch_composition(llama_engine, tiny_model_dir, tiny_prompts):
    full = llama_engine.generate(tiny_prompts, SAMPLED)
    assert tokens(llama_engine.generate(tiny_prompts, SAMPLED)) == tokens(full)  # same call again
    # prompt 2 alone with seed + 2 is the same request as prompt 2 of the full call
    alone = llama_engine.generate([tiny_prompts[2]], dataclasses.replace(SAMPLED, seed=SAMPLED.seed + 2))
    assert tokens(alone) == [tokens(full)[2]]
    # a tiny batch (rows join and leave all the time) gives the same samples
    narrow = NativeEngine(tiny_model_dir, max_batch_size=2, max_seq_len=256)
    narrow_results = narrow.generate(tiny_prompts, SAMPLED)
    assert tokens(narrow_results) == tokens(full)
    for got, want in zip(narrow_results, full):
        for a, b in zip(got, want):
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5
    # the samples of one prompt differ from each other, and another seed changes them
    assert len({tuple(t) for t in tokens(full)[2]}) > 1
    assert tokens(llama_engine.generate(tiny_prompts, dataclasses.replace(SAMPLED, seed=12))) != tokens(full)


def test_n_samples_share_one_prefill(llama_engine, tiny_model_dir, tiny_prompts):
    llama_engine.stats.reset()
    results = llama_engine.generate(tiny_prompts, SAMPLED)
    assert llama_engine.stats.prefill_prompts == len(tiny_prompts)  # not len(prompts) * n
    assert llama_engine.stats.prefill_forwards == 1
    # one row at a time: every sample gets its own prefill, and the samples are the same
    single = NativeEngine(tiny_model_dir, max_batch_size=1, max_seq_len=256)
    assert tokens(single.generate(tiny_prompts, SAMPLED)) == tokens(results)
    assert single.stats.prefill_prompts == len(tiny_prompts) * SAMPLED.n


def test_continuous_batching_gives_the_same_greedy_outputs(llama_engine, tiny_model_dir, tiny_prompts):
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    prompts = tiny_prompts * 2  # 10 requests through 3 rows
    wide = llama_engine.generate(prompts, greedy)
    narrow_engine = NativeEngine(tiny_model_dir, max_batch_size=3, max_seq_len=256)
    narrow = narrow_engine.generate(prompts, greedy)
    assert tokens(narrow) == tokens(wide)
    assert narrow_engine.stats.prefill_forwards > 1  # rows really joined mid-way


def test_stop_string_cuts_at_the_completing_token(llama_engine, tiny_tokenizer, tiny_prompts):
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=(10**4 % 7,))
    base = llama_engine.generate([tiny_prompts[0]], greedy)[0][0]
    # choose a stop string that ends inside the decoded text of token 6
    prefix5 = tiny_tokenizer.decode(base.token_ids[:5])
    prefix6 = tiny_tokenizer.decode(base.token_ids[:6])
    stop = prefix6[max(len(prefix5) - 2, 0) : len(prefix6)]
    assert stop and stop not in prefix5
    first = next(k for k in range(1, 7) if stop in tiny_tokenizer.decode(base.token_ids[:k]))
    cut = llama_engine.generate([tiny_prompts[0]], dataclasses.replace(greedy, stop_strings=("zzzqqq", stop)))[0][0]
    assert cut.token_ids == base.token_ids[:first]
    assert cut.finish_reason == "stop"
    assert cut.text == tiny_tokenizer.decode(cut.token_ids) and stop in cut.text
    assert len(cut.logprobs) == len(cut.token_ids)


def test_stop_token_ids_and_finish_reasons(llama_engine, tiny_prompts):
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=(511,))
    base = llama_engine.generate([tiny_prompts[1]], greedy)[0][0]
    assert base.finish_reason == "length" and len(base.token_ids) == 24
    stop_at = base.token_ids[4]
    first = base.token_ids.index(stop_at)
    stopped = llama_engine.generate([tiny_prompts[1]], dataclasses.replace(greedy, stop_token_ids=(stop_at,)))[0][0]
    assert stopped.token_ids == base.token_ids[: first + 1]  # the stop token is kept
    assert stopped.finish_reason == "stop"


def test_context_limit_ends_with_length(tiny_model_dir, tiny_prompts):
    prompt = tiny_prompts[2]
    engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=len(prompt) + 6)
    result = engine.generate([prompt], SamplingParams(max_new_tokens=50, temperature=0.0, stop_token_ids=(511,)))
    completion = result[0][0]
    assert len(completion.token_ids) == 6
    assert completion.finish_reason == "length"


def test_sleep_frees_the_cache_and_wake_restores_it(tiny_model_dir, tiny_prompts):
    engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=64)
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    before = tokens(engine.generate(tiny_prompts, greedy))
    engine.sleep()
    assert engine.cache.nbytes() == 0
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(tiny_prompts, greedy)
    engine.wake()
    assert engine.cache.nbytes() > 0
    assert tokens(engine.generate(tiny_prompts, greedy)) == before


BAD_REQUESTS = [
    ("empty prompt", [[]], SamplingParams(), "prompt 1 is empty"),
    ("too long", [list(range(300))], SamplingParams(), "max_seq_len"),
    ("token out of vocab", [[1, 10**6]], SamplingParams(), "not a token id"),
    ("string prompt", ["hello"], SamplingParams(), "string"),
    ("max_new_tokens 0", [[1, 2]], SamplingParams(max_new_tokens=0), "max_new_tokens"),
    ("top_p 0", [[1, 2]], SamplingParams(top_p=0.0), "top_p"),
    ("top_p above 1", [[1, 2]], SamplingParams(top_p=1.5), "top_p"),
    ("stop string not a str", [[1, 2]], SamplingParams(stop_strings=(5,)), "stop_strings"),
    ("stop strings as a bare str", [[1, 2]], SamplingParams(stop_strings="ab"), "stop_strings must be a tuple"),
    ("stop token not an int", [[1, 2]], SamplingParams(stop_token_ids=("x",)), "stop_token_ids"),
    ("negative temperature", [[1, 2]], SamplingParams(temperature=-1.0), "temperature"),
]


@pytest.mark.parametrize("name,prompts,sampling,message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_fail_clearly_and_the_engine_keeps_working(llama_engine, tiny_prompts, name, prompts,
                                                                 sampling, message):
    with pytest.raises(ValueError, match=message):
        llama_engine.generate([tiny_prompts[0], *prompts], sampling)
    ok = llama_engine.generate([tiny_prompts[0]], SamplingParams(max_new_tokens=3, temperature=0.0))
    assert len(ok[0][0].token_ids) == 3 or ok[0][0].finish_reason == "stop"


def test_empty_prompt_list_returns_nothing(llama_engine):
    assert llama_engine.generate([], SamplingParams()) == []

