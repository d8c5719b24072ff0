"""Speculative decoding in the native engine is exact: greedy equals plain greedy, samples follow the
target's distribution, logprobs are the target's."""

from __future__ import annotations

import collections
import dataclasses
import itertools
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from rl_backends_gen.config import GenerationConfig, SpeculativeConfig
from rl_backends_gen.native import NativeEngine
from rl_core.types import SamplingParams

# max_batch_rows high: these engines speculate at every step (test_switching_... covers the adaptive switch).
NGRAM = SpeculativeConfig(method="ngram", num_tokens=3, ngram={"min_n": 1, "max_n": 3}, max_batch_rows=4096)
DRAFT = SpeculativeConfig(method="draft", num_tokens=3, draft_model="policy_layers:1", max_batch_rows=4096)
METHODS = {"ngram": NGRAM, "draft": DRAFT}
# Repetitive prompts give the n-gram proposer something to find.
REPEATS = ["1 2 3 1 2 3 1 2 3 1 2", "move left, move up, move left, move up, move"]


def tokens(results):
    return [[c.token_ids for c in samples] for samples in results]


@pytest.fixture(scope="module")
def prompts(tiny_prompts, tiny_tokenizer):
    return tiny_prompts + [tiny_tokenizer.encode(text) for text in REPEATS]


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    return NativeEngine(tiny_model_dir, max_batch_size=16, max_seq_len=128)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_greedy_is_plain_greedy_token_for_token(method, tiny_model_dir, plain, prompts, tiny_tokenizer):
    greedy = SamplingParams(max_new_tokens=30, temperature=0.0)
    expected = plain.generate(prompts * 2, greedy)
    # 3 rows for 14 requests: rows join and leave mid-way, accept different counts, roll back
    engine = NativeEngine(tiny_model_dir, max_batch_size=3, max_seq_len=128, speculative=METHODS[method])
    got = engine.generate(prompts * 2, greedy)
    assert tokens(got) == tokens(expected)
    for a, b in zip(got, expected):
        assert a[0].finish_reason == b[0].finish_reason
        assert max(abs(x - y) for x, y in zip(a[0].logprobs, b[0].logprobs)) <= 1e-5
    stats = engine.speculative.last_call
    assert 0 < stats.accepted_tokens < stats.proposed_tokens  # both acceptance and rollback happened
    assert engine.stats.decode_steps < sum(len(c[0].token_ids) for c in got) - len(got)  # fewer forwards
    # a stop string and a stop token cut exactly where the plain engine cuts
    base = expected[1][0].token_ids
    stop = tiny_tokenizer.decode(base[:6])[-3:]
    cut = dataclasses.replace(greedy, stop_strings=(stop,), stop_token_ids=(base[9],))
    assert tokens(engine.generate(prompts, cut)) == tokens(plain.generate(prompts, cut))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_sampled_logprobs_are_the_targets_and_seeds_reproduce(method, tiny_model_dir, prompts, training_logprobs,
                                                              load_hf_model):
    sampling = SamplingParams(max_new_tokens=20, temperature=0.7, top_p=0.95, top_k=5, n=3, seed=4)
    engine = NativeEngine(tiny_model_dir, max_batch_size=16, max_seq_len=128, speculative=METHODS[method])
    results = engine.generate(prompts, sampling)
    assert engine.speculative.last_call.accepted_tokens > 0
    flat = [(prompt, c) for prompt, samples in zip(prompts, results) for c in samples]
    expected = training_logprobs(load_hf_model(tiny_model_dir), [p for p, _ in flat], [c.token_ids for _, c in flat],
                                 0.7)
    assert max((torch.tensor(c.logprobs) - want).abs().max().item() for (_, c), want in zip(flat, expected)) <= 1e-5
    assert all(len(c.token_ids) <= 20 and len(c.logprobs) == len(c.token_ids) for _, c in flat)
    # the same seed gives the same samples, whatever the batch (2 rows: continuous batching)
    narrow = NativeEngine(tiny_model_dir, max_batch_size=2, max_seq_len=128, speculative=METHODS[method])
    assert tokens(narrow.generate(prompts, sampling)) == tokens(results)
    assert tokens(engine.generate(prompts, dataclasses.replace(sampling, seed=5))) != tokens(results)
    # verification emits the plain sampler's own draws: the same seed gives the plain engine's samples
    plain = NativeEngine(tiny_model_dir, max_batch_size=16, max_seq_len=128)
    assert tokens(plain.generate(prompts, sampling)) == tokens(results)


def _joint_probabilities(model, prompt: list[int], top_k: int, length: int) -> dict[tuple[int, ...], float]:
    """Exact probability of every continuation of ``length`` tokens under top-k sampling at T = 1."""
    out: dict[tuple[int, ...], float] = {}

    def expand(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length:
            out[prefix] = prob
            return
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + list(prefix)])).logits[0, -1].double()
        values, ids = logits.topk(top_k)
        for p, token in zip(torch.softmax(values, dim=0).tolist(), ids.tolist()):
            expand(prefix + (token,), prob * p)

    expand((), 1.0)
    return out


def _p_value(cells: list[tuple[float, float]]) -> float:
    """Chi-square p-value of (observed, expected) cells."""
    statistic = sum((count - expected) ** 2 / expected for count, expected in cells)
    return float(torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def test_draft_samples_follow_the_targets_distribution(tiny_model_dir, prompts, load_hf_model):
    """Chi-square of the first 3 tokens' joint under top-3 sampling (27 cells): tokens 2 and 3 come out of
    verification against the draft's proposals."""
    prompt, top_k, samples = prompts[-1], 3, 3000
    probs = _joint_probabilities(load_hf_model(tiny_model_dir), prompt, top_k, 3)
    support = {token for key in probs for token in key}
    engine = NativeEngine(tiny_model_dir, max_batch_size=256, max_seq_len=128, speculative=DRAFT)
    sampling = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=top_k, n=samples, seed=123,
                              stop_token_ids=(min(set(range(512)) - support),))
    counts = dict.fromkeys(probs, 0)
    for completion in engine.generate([prompt], sampling)[0]:
        counts[tuple(completion.token_ids)] += 1  # KeyError: a token outside the target's support
    stats = engine.speculative.last_call
    assert 300 < stats.accepted_tokens < stats.proposed_tokens - 300  # both branches, many times
    assert _p_value([(counts[key], samples * p) for key, p in probs.items()]) > 1e-3, counts


def test_verifier_emits_the_targets_distribution():
    """verify on fixed logits over 6 tokens, 20000 rows with their own uniforms: the first emitted token
    follows p_0, and where the first proposal was accepted the second follows p_1; every drawn token is
    the plain sampler's with the same uniform."""
    from rl_backends_gen.native.sampling import sample_tokens
    from rl_backends_gen.native.verify import verify

    rows, vocab, k = 20000, 6, 2
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1, k + 1, vocab, generator=generator).mul(1.5).expand(rows, -1, -1).contiguous()
    sampling = SamplingParams(temperature=1.0, top_k=5)
    target = torch.softmax(logits[0], dim=-1)
    target[target < target.topk(5, dim=-1).values[:, -1:]] = 0
    target /= target.sum(dim=-1, keepdim=True)  # [k + 1, V] what the plain sampler draws from
    # a fixed guess per position (n-gram): p_0's likeliest token, then p_1's
    proposals = torch.tensor([[int(target[0].argmax()), int(target[1].argmax())]]).expand(rows, k)
    uniforms = torch.rand(rows, k + 1, generator=generator, dtype=torch.float64)
    verified = verify(logits, proposals, torch.full((rows,), k), sampling, uniforms)
    first = verified.tokens[:, 0]
    first_counts = torch.bincount(first, minlength=vocab).double()
    support = target[0] > 0
    assert first_counts[~support].sum() == 0
    assert _p_value(list(zip(first_counts[support].tolist(), (rows * target[0][support]).tolist()))) > 1e-3
    took_first = verified.accepted >= 1
    assert torch.equal(took_first, first == proposals[:, 0])  # accepted exactly when the draw is the proposal
    second = torch.bincount(verified.tokens[took_first, 1], minlength=vocab).double()
    support = target[1] > 0
    expected = int(took_first.sum()) * target[1]
    assert 2000 < int(took_first.sum()) < rows - 2000 and second[~support].sum() == 0
    assert _p_value(list(zip(second[support].tolist(), expected[support].tolist()))) > 1e-3
    plain, _ = sample_tokens(logits[:, 1], sampling, uniforms[:, 1])
    assert torch.equal(verified.tokens[:, 1], plain)
    # logprobs are log_softmax(logits / T) over the full vocabulary at the emitted tokens
    want = torch.log_softmax(logits, dim=-1).gather(2, verified.tokens[..., None]).squeeze(2)
    assert torch.allclose(verified.logprobs, want, atol=1e-6)


@pytest.fixture(scope="module")
def path_draft_dir(tiny_model_dir, tmp_path_factory, load_hf_model):
    """An HF model of its own (not the engine's layers): the policy cut to its first layer."""
    draft = load_hf_model(tiny_model_dir)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    path = tmp_path_factory.mktemp("draft")
    draft.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("method", ["ngram", "draft", "draft-path"])
def test_switching_between_plain_and_speculative_steps_mid_call(method, tiny_model_dir, prompts, path_draft_dir):
    """8 rows, 3 proposals: a step speculates only with at most 3 active rows (3 x 4 <= 12). Length limits
    differ by prompt (max_seq_len 64), so rows leave one by one and new ones join: the call switches both
    ways. Greedy and seeded samples equal the plain engine's, token for token."""
    spec = (NGRAM if method == "ngram" else DRAFT).model_copy(update={"max_batch_rows": 12})
    if method == "draft-path":
        spec = spec.model_copy(update={"draft_model": path_draft_dir})
    engine = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=64, speculative=spec)
    plain = NativeEngine(tiny_model_dir, max_batch_size=8, max_seq_len=64)
    for sampling in (SamplingParams(max_new_tokens=64, temperature=0.0, stop_token_ids=(0,)),
                     SamplingParams(max_new_tokens=64, temperature=1.0, n=2, seed=7, stop_token_ids=(0,))):
        engine.stats.reset()
        got = engine.generate(prompts, sampling)
        want = plain.generate(prompts, sampling)
        assert tokens(got) == tokens(want)
        assert max(abs(x - y) for a, b in zip(got, want) for c, d in zip(a, b)
                   for x, y in zip(c.logprobs, d.logprobs)) <= 1e-5
        stats = engine.speculative.last_call
        assert stats.plain_steps > 0 and stats.verify_steps > 0 and stats.proposed_tokens > 0
        # greedy drafts agree with the target here (these tails hold little to look up for n-grams)
        assert stats.accepted_tokens > 0 or method == "ngram" or not sampling.greedy
        assert engine.stats.decode_steps == stats.plain_steps + stats.verify_steps
    # the policy's own layers draft from the engine's cache: no cache of its own
    assert engine.speculative.proposer.caches == ([engine.speculative.proposer.cache] if method == "draft-path" else [])


def test_a_draft_with_the_targets_distribution_is_accepted_at_temperature_1(tiny_model_dir, plain, prompts):
    """Coupled draws: the draft samples its proposals with the rows' own uniforms, so a draft whose
    distribution is the target's (here the target itself, from its path) proposes the target's own tokens
    at T = 1. (An argmax proposal would be accepted with p(argmax) only: rarely, on this flat random model.)"""
    spec = SpeculativeConfig(method="draft", num_tokens=3, draft_model=str(tiny_model_dir), max_batch_rows=4096)
    engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, speculative=spec)
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0, n=2, seed=3)
    got = engine.generate(prompts, sampling)
    assert tokens(got) == tokens(plain.generate(prompts, sampling))
    stats = engine.speculative.last_call
    assert stats.proposed_tokens > 50 and stats.accepted_tokens >= 0.95 * stats.proposed_tokens
    # and with top-k / top-p, which the draft's draw applies as the target's does
    engine.generate(prompts, dataclasses.replace(sampling, top_k=5, top_p=0.9))
    stats = engine.speculative.last_call
    assert stats.proposed_tokens > 50 and stats.accepted_tokens >= 0.95 * stats.proposed_tokens


def test_draft_from_a_path_and_metrics(tiny_model_dir, plain, prompts, tmp_path, load_hf_model):
    draft = load_hf_model(tiny_model_dir)  # an HF model of its own: the policy cut to its first layer
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    draft_dir = tmp_path / "draft"
    draft.save_pretrained(draft_dir)
    spec = SpeculativeConfig(method="draft", num_tokens=2, draft_model=str(draft_dir))
    engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, speculative=spec)
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    assert tokens(engine.generate(prompts, greedy)) == tokens(plain.generate(prompts, greedy))
    metrics = engine.speculative.pop_metrics()
    assert 0 < metrics["acceptance_rate"] < 1
    assert 0 < metrics["mean_accepted_length"] <= 2
    assert 1 < metrics["tokens_per_row_step"] <= 3
    assert 0 < metrics["draft_time_share"] < 1
    assert engine.speculative.pop_metrics()["proposed_tokens"] == 0  # popped


def test_draft_with_another_vocabulary_is_refused(tiny_model_dir, tmp_path):
    from rl_core.models import save_tiny_model

    draft_dir = save_tiny_model(tmp_path / "draft", family="llama", vocab_size=300)
    spec = SpeculativeConfig(method="draft", draft_model=str(draft_dir))
    with pytest.raises(ValueError, match="must share the policy's tokenizer"):
        NativeEngine(tiny_model_dir, max_batch_size=2, max_seq_len=64, speculative=spec)
    with pytest.raises(ValueError, match="has only 2 decoder layers"):
        NativeEngine(tiny_model_dir, max_batch_size=2, max_seq_len=64,
                     speculative=SpeculativeConfig(method="draft", draft_model="policy_layers:2"))


def test_a_draft_that_cannot_fit_the_policy_is_a_config_error_before_any_engine(tiny_model_dir, tmp_path):
    """check_generation (run by the CLI before a run writes anything): every key named, from the configs alone."""
    from rl_backends_gen import check_generation
    from rl_core.config import ConfigError
    from rl_core.models import save_tiny_model

    other = save_tiny_model(tmp_path / "other", family="llama", vocab_size=300)
    cases = {"policy_layers:2": "the policy (", str(other): "its vocabulary has 300 tokens, the policy's 512",
             str(tmp_path / "none"): "no such directory", str(tmp_path): "no config.json"}
    for draft_model, message in cases.items():
        cfg = GenerationConfig(speculative={"method": "draft", "draft_model": draft_model, "draft_vocab_size": 512})
        with pytest.raises(ConfigError) as error:
            check_generation(cfg, tiny_model_dir)
        assert [p.key for p in error.value.problems] == ["generation.speculative.draft_model",
                                                         "generation.speculative.draft_vocab_size"]
        assert message in str(error.value.problems[0]) and "has only 512 tokens" in str(error.value.problems[1])
    check_generation(GenerationConfig(speculative={"method": "draft", "draft_model": "policy_layers:1",
                                              "draft_vocab_size": 511}), tiny_model_dir)  # fits: no error


def test_a_draft_directory_the_engine_cannot_use_is_a_config_error(tiny_model_dir, tiny_family_dir, tiny_vlm_dir,
                                                                  tmp_path):
    """Beyond the vocabulary: a bare name (nothing is downloaded), a directory without weights, a draft whose
    layers the engine cannot speculate on or train, draft_top_k past the vocabulary, and speculation on a
    vision-language model: each one problem naming its key, from check_generation (before any engine)."""
    import shutil

    from rl_backends_gen import check_generation
    from rl_core.config import ConfigError

    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(Path(tiny_model_dir) / "config.json", no_weights)
    trained = {"train_draft": True, "draft_top_k": 64}
    cases = [({"draft_model": "some-draft"}, tiny_model_dir, "speculative.draft_model", "no such directory"),
             ({"draft_model": str(no_weights)}, tiny_model_dir, "speculative.draft_model", "holds no weights"),
             ({"draft_model": tiny_family_dir("qwen3_5_text")}, tiny_model_dir, "speculative.draft_model",
              "is a recurrent layer"),
             ({"draft_model": tiny_family_dir("glm4_moe_lite"), **trained}, tiny_model_dir,
              "speculative.train_draft", "the draft (" + tiny_family_dir("glm4_moe_lite")),
             ({"draft_model": "policy_layers:1", "train_draft": True, "draft_top_k": 513}, tiny_model_dir,
              "speculative.draft_top_k", "set draft_top_k <= 512"),
             ({"draft_model": "policy_layers:1"}, tiny_vlm_dir("qwen2_5_vl"), "speculative",
              "is a vision-language model")]
    for settings, policy, key, message in cases:
        with pytest.raises(ConfigError) as error:
            check_generation(GenerationConfig(speculative={"method": "draft", **settings}), policy)
        [problem] = error.value.problems
        assert problem.key == f"generation.{key}" and message in problem.message, (settings, problem)
    check_generation(GenerationConfig(speculative={"method": "draft", "draft_model": tiny_family_dir("qwen3"),
                                                   **trained}), tiny_model_dir)  # a trainable draft: no error
    with pytest.raises(ValueError, match="draft_top_k 513: the policy's vocabulary has 512 tokens"):
        NativeEngine(tiny_model_dir, max_batch_size=2, max_seq_len=64, speculative=SpeculativeConfig(
            method="draft", draft_model="policy_layers:1", train_draft=True, draft_top_k=513))


@pytest.mark.parametrize("raw,message", [
    ({"method": "eagle"}, "method"),
    ({"method": "ngram", "num_tokenz": 3}, "num_tokenz"),
    ({"method": "ngram", "ngram": {"min_n": 4, "max_n": 2}}, "must not exceed"),
    ({"method": "draft", "draft_model": "policy_layers:x"}, "policy_layers:N"),
    ({"method": "draft", "draft_model": "policy_layers:\u00b2"}, "policy_layers:N"),
    ({"method": "draft", "num_tokens": 0}, "num_tokens"),
    ({"method": "ngram", "draft_vocab_size": 8}, "draft_vocab_size sizes a draft model's head"),
    ({"method": "draft", "draft_vocab_size": 0}, "draft_vocab_size"),
])
def test_bad_speculative_configs_fail_clearly(raw, message):
    with pytest.raises(ValidationError, match=message):
        SpeculativeConfig.model_validate(raw)


def test_backends_without_speculation_refuse_it():
    with pytest.raises(ValidationError, match="not backend=sglang"):
        GenerationConfig(backend="sglang", speculative={"method": "ngram"})
    with pytest.raises(ValidationError, match="draft_vocab_size is the native engine's"):
        GenerationConfig(backend="vllm", speculative={"method": "draft", "draft_model": "/drafts/a",
                                                      "draft_vocab_size": 8})
    assert GenerationConfig(backend="native", speculative={"method": "ngram"}).speculative.num_tokens == 4


def test_ngram_index_proposes_what_followed_the_latest_match():
    from rl_backends_gen.native.proposers import NgramIndex

    index = NgramIndex([5, 6, 7, 8, 5, 6, 9, 5, 6], min_n=1, max_n=2)
    assert index.propose(3) == [9, 5, 6]  # "5 6" last followed by 9
    index.extend([1])
    assert index.propose(2) == []  # 1 never occurred before
    index.extend([7])
    assert index.propose(2) == [8, 5]  # "1 7" is new, "7" followed by 8
    assert list(itertools.islice(index.tokens, 3)) == [5, 6, 7]


@pytest.mark.parametrize("family", ["glm4_moe_lite", "gpt_oss", "gemma3_text"])
def test_greedy_speculation_across_attention_kinds(family, tiny_family_dir, tiny_prompts):
    """Latent attention, sliding windows and sinks verify several queries per row like one."""
    path = tiny_family_dir(family)
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    expected = NativeEngine(path, max_batch_size=4, max_seq_len=128).generate(tiny_prompts, greedy)
    engine = NativeEngine(path, max_batch_size=4, max_seq_len=128, speculative=DRAFT)
    assert tokens(engine.generate(tiny_prompts, greedy)) == tokens(expected)
    assert engine.speculative.last_call.accepted_tokens > 0


def test_recurrent_layers_are_refused(tiny_family_dir):
    with pytest.raises(NotImplementedError, match="cannot roll back"):
        NativeEngine(tiny_family_dir("qwen3_5_text"), max_batch_size=2, max_seq_len=64, speculative=NGRAM)


def test_the_engines_refusals_are_config_errors_before_it_is_built(tiny_family_dir, tiny_model_dir):
    """check_generation asks the engine's own refusals of a meta-device copy of the model: speculation on
    recurrent layers, train_draft on latent attention, record_routing on a dense model; each names its key."""
    from rl_backends_gen import check_generation
    from rl_core.config import ConfigError

    trained = {"method": "draft", "draft_model": "policy_layers:1", "train_draft": True}
    cases = [({"speculative": {"method": "ngram"}}, "qwen3_5_text", "generation.speculative", "cannot roll back"),
             ({"speculative": trained}, "glm4_moe_lite", "generation.speculative.train_draft", "is not softmax attention"),
             ({"record_routing": True}, None, "generation.record_routing", "has no mixture-of-experts router")]
    for settings, family, key, message in cases:
        path = tiny_family_dir(family) if family else tiny_model_dir
        with pytest.raises(ConfigError) as error:
            check_generation(GenerationConfig(**settings), path)
        [problem] = error.value.problems
        assert problem.key == key and message in problem.message
    check_generation(GenerationConfig(record_routing=True, speculative=trained), tiny_family_dir("qwen3_moe"))


def test_draft_vocabulary_proposes_its_most_frequent_tokens_only_and_keeps_the_output(tiny_model_dir, plain, prompts):
    """draft_vocab_size=64 of 512: the draft proposes from the 64 tokens counted most in the engine's prompts
    and completions so far (ties: the lower id), re-picked at each call from the head as it is then; the
    output stays the plain engine's, token for token."""
    spec = DRAFT.model_copy(update={"draft_vocab_size": 64})
    engine = NativeEngine(tiny_model_dir, max_batch_size=4, max_seq_len=128, speculative=spec)
    proposer = engine.speculative.proposer
    proposed = []
    propose = proposer.propose

    def recording(call, k):
        proposals = propose(call, k)
        proposed.append((proposer.vocab.ids.clone(), proposals.tokens.clone()))
        return proposals

    proposer.propose = recording
    counts = collections.Counter()

    def expected_ids(counts):
        return sorted(sorted(range(512), key=lambda token: (-counts[token], token))[:64])

    for sampling in (SamplingParams(max_new_tokens=24, temperature=0.0),
                     SamplingParams(max_new_tokens=24, temperature=1.0, n=2, seed=3)):
        for prompt in prompts:
            counts.update(prompt)
        got = engine.generate(prompts, sampling)
        assert tokens(got) == tokens(plain.generate(prompts, sampling))
        assert proposer.vocab.ids.tolist() == expected_ids(counts)
        completions = [c.token_ids for samples in got for c in samples]
        inside = sum(token in set(expected_ids(counts)) for c in completions for token in c)
        metrics = engine.speculative.last_call.metrics()
        assert metrics["draft_vocab_coverage"] == inside / sum(len(c) for c in completions)
        for c in completions:
            counts.update(c)
    assert proposed and all(torch.isin(tokens_, ids).all() for ids, tokens_ in proposed)
    assert engine.speculative.last_call.accepted_tokens > 0
    assert "draft_vocab_coverage" not in NativeEngine(  # no draft vocabulary: no such metric
        tiny_model_dir, max_batch_size=4, max_seq_len=128, speculative=DRAFT).speculative.last_call.metrics()
    engine.sleep()  # frees the copied head rows with the caches; the next call copies them again
    assert proposer.vocab.weight is None
    engine.wake()
    # a refit (in place, as copy_weights_in_place writes) reaches the draft vocabulary's head rows
    with torch.no_grad():
        engine.head.weight.mul_(1.5)
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert torch.equal(proposer.vocab.weight, engine.head.weight[proposer.vocab.ids])
    with pytest.raises(ValueError, match="vocabulary has only 512 tokens"):
        NativeEngine(tiny_model_dir, max_batch_size=2, max_seq_len=64,
                     speculative=DRAFT.model_copy(update={"draft_vocab_size": 512}))
