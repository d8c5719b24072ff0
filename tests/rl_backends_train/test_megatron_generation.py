"""``generation.backend: megatron``: decoding on the Megatron policy's own GPTModel (CPU, gloo).

Greedy equals HF ``generate`` on the same weights; per-token logprobs (greedy and sampled, any
temperature) equal the Megatron training forward (fp32: max |diff| <= 1e-5); seeded sampling is
reproducible and does not depend on the batch size; stop tokens, stop strings and n samples follow the
native engine's rules; a refit reads no weight; the policy trained in between is what decodes next;
tensor parallel 2 and pipeline parallel 2 decode as one rank; what it cannot do is refused."""

from __future__ import annotations

import pytest
import torch
from backend_testlib import MaskedNLL, make_batch, megatron_config

from rl_backends_gen import GenerationConfig, build_generation_backend
from rl_backends_train import TrainBackendConfig, build_training_backend
from rl_core.types import SamplingParams

pytest.importorskip("megatron.core")

BASE = {"optimizer": {"lr": 1e-2}, "reference_model": False}
PROMPTS = [[5, 17, 42, 99, 7], [8, 300, 12], [44, 45, 46, 47, 48, 49, 50, 51, 52], [260]]


def generation_for(policy, **overrides):
    return build_generation_backend(GenerationConfig(backend="megatron", **overrides), policy.model_path, policy=policy)


def scored_batch(results) -> tuple[dict[str, torch.Tensor], list[tuple[int, int, int]]]:
    """Prompt + completion rows (right-padded) and, per completion, (row, first completion column, length)."""
    rows = [(c.prompt_token_ids, c.token_ids) for samples in results for c in samples]
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    where = []
    for r, (prompt, tokens) in enumerate(rows):
        ids[r, : len(prompt) + len(tokens)] = torch.tensor(prompt + tokens)
        mask[r, : len(prompt) + len(tokens)] = 1
        where.append((r, len(prompt), len(tokens)))
    return {"input_ids": ids, "attention_mask": mask}, where


def assert_logprobs_equal_training(policy, results, temperature: float) -> None:
    batch, where = scored_batch(results)
    trained = policy.logprobs(batch, temperature=temperature)
    generated = [c.logprobs for samples in results for c in samples]
    worst = max(float((trained[r, s:s + n] - torch.tensor(lp)).abs().max()) for (r, s, n), lp in zip(where, generated))
    assert worst <= 1e-5, worst


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    with build_training_backend(megatron_config(BASE), tiny_model_dir) as backend:
        yield backend


def test_greedy_equals_hf_generate_and_logprobs_equal_training(policy, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    generation = generation_for(policy, max_batch_size=3)  # two batches of samples
    results = generation.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(2,)))
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for prompt, (completion,) in zip(PROMPTS, results):
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=2,
                               pad_token_id=3)[0, len(prompt):].tolist()
        assert completion.token_ids == expected
        assert completion.finish_reason == ("stop" if expected[-1] == 2 else "length")
        assert completion.text is not None
    assert_logprobs_equal_training(policy, results, temperature=1.0)
    assert generation.stats["prefill_forwards"] == 2 and generation.stats["peak_cache_bytes"] > 0


def test_sampling_is_seeded_batch_independent_and_scored_like_training(policy):
    sampling = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=50, top_p=0.9, n=3, seed=11)
    results = generation_for(policy, max_batch_size=16).generate(PROMPTS, sampling)
    again = generation_for(policy, max_batch_size=2).generate(PROMPTS, sampling)
    assert [[c.token_ids for c in s] for s in results] == [[c.token_ids for c in s] for s in again]
    flat = [lp for s in results for c in s for lp in c.logprobs]
    assert flat == pytest.approx([lp for s in again for c in s for lp in c.logprobs], abs=1e-5)
    assert len({tuple(c.token_ids) for c in results[0]}) > 1  # n samples differ
    other = generation_for(policy).generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.7, n=3, seed=12))
    assert [c.token_ids for c in other[0]] != [c.token_ids for c in results[0]]
    assert_logprobs_equal_training(policy, results, temperature=0.7)


def test_stop_strings_and_stop_tokens(policy):
    """A stop string ends a sample at the token that completes it (kept; the text contains it)."""
    generation = generation_for(policy)
    free = generation.generate(PROMPTS[:2], SamplingParams(max_new_tokens=16, temperature=1.0, seed=3))
    text = free[0][0].text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop.strip()
    cut = generation.generate(PROMPTS[:2], SamplingParams(max_new_tokens=16, temperature=1.0, seed=3,
                                                          stop_strings=(stop,)))[0][0]
    assert cut.finish_reason == "stop" and stop in cut.text
    assert cut.token_ids == free[0][0].token_ids[: len(cut.token_ids)]
    assert stop not in generation.tokenizer.decode(cut.token_ids[:-1], skip_special_tokens=True)
    token = free[1][0].token_ids[3]
    stopped = generation.generate(PROMPTS[1:2], SamplingParams(max_new_tokens=16, temperature=1.0, seed=4,
                                                               stop_token_ids=(token,)))
    # Prompt 1 of the first call is prompt 0 here: seed 4 = 3 + 1 draws the same sample.
    assert stopped[0][0].token_ids == free[1][0].token_ids[: free[1][0].token_ids.index(token) + 1]
    assert stopped[0][0].finish_reason == "stop"


def test_refit_reads_nothing_and_the_trained_policy_decodes(policy, tiny_model_dir):
    """The weights the policy trains are the weights that decode: no copy in between."""
    generation = generation_for(policy)

    def unread():
        raise AssertionError("update_weights read a weight")
        yield

    generation.update_weights(unread())
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = generation.generate(PROMPTS, greedy)
    for _ in range(3):
        policy.train(make_batch(500, [12, 9, 14]), MaskedNLL())
    after = generation.generate(PROMPTS, greedy)
    assert [s[0].token_ids for s in after] != [s[0].token_ids for s in before]
    assert_logprobs_equal_training(policy, after, temperature=1.0)
    generation.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        generation.generate(PROMPTS, greedy)
    generation.wake()


def test_what_it_cannot_do_is_refused(policy, tiny_model_dir):
    with pytest.raises(ValueError, match=r"generation.dtype='bfloat16' differs from policy.dtype='float32'"):
        generation_for(policy, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"generation.num_replicas=2"):
        generation_for(policy, num_replicas=2)
    with build_training_backend(TrainBackendConfig(use_ray=False, **BASE), tiny_model_dir) as dtensor:
        with pytest.raises(ValueError, match="needs policy.backend=megatron"):
            generation_for(dtensor)
    with pytest.raises(ValueError, match=r"prompt 0 holds 100000"):
        generation_for(policy).generate([[100000]], SamplingParams())


@pytest.mark.parametrize("layout", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2},
                                    {"num_workers": 2, "tensor_parallel_size": 1}])
def test_model_parallel_and_data_parallel_decode_as_one_rank(ray_session, tiny_tp_dir, layout):
    """TP 2 (each rank its KV heads' cache), PP 2 (activations sent between stages, tokens back) and
    DP 2 (each rank a slice of the prompts) sample what one rank samples."""
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, n=2, seed=5)
    workers = layout.get("num_workers", 2)
    cfg = megatron_config(BASE, **({"num_workers": workers} | layout))
    with build_training_backend(cfg, tiny_tp_dir) as parallel:
        got = generation_for(parallel).generate(PROMPTS, sampling)
    with build_training_backend(megatron_config(BASE), tiny_tp_dir) as one:
        expected = generation_for(one).generate(PROMPTS, sampling)
    assert [[c.token_ids for c in s] for s in got] == [[c.token_ids for c in s] for s in expected]
    for samples, reference in zip(got, expected):
        for c, r in zip(samples, reference):
            assert c.logprobs == pytest.approx(r.logprobs, abs=1e-5)


def test_bf16_policy_decodes_with_its_bf16_compute(tiny_model_dir):
    """The fp32 masters are swapped for bf16 copies as in a training forward: logprobs near the bf16
    training forward's, and the masters are fp32 again afterwards."""
    with build_training_backend(megatron_config(BASE, dtype="bfloat16"), tiny_model_dir) as bf16:
        results = generation_for(bf16, dtype="bfloat16").generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=1))
        batch, where = scored_batch(results)
        trained = bf16.logprobs(batch)
        weights = dict(bf16.named_weights())
    for (r, s, n), samples in zip(where, results):
        assert (trained[r, s:s + n] - torch.tensor(samples[0].logprobs)).abs().max() < 1e-2
    assert {t.dtype for t in weights.values()} == {torch.float32}
