"""The multi-turn rollout engine with the real native engine on the tiny model: token bookkeeping,
masks, logprobs, length limits, environment faults, and the Batch it produces."""

from __future__ import annotations

import math
import time

import pytest
import torch
from rollout_testlib import RecordingBackend

from rl_algorithms.rollout import (
    ChatTokens,
    TemplateNotAppendOnlyError,
    episodes_to_batch,
    rollout_metrics,
    run_rollouts,
)
from rl_core.types import PromptSample, SamplingParams, StepResult
from rl_environments import (
    ArithmeticDatasetConfig,
    ArithmeticEnvironment,
    SlidingPuzzleDatasetConfig,
    SlidingPuzzleEnvironment,
    reward_function_environment,
)


def sampling(tokenizer, max_new_tokens=8, seed=1, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed,
                          stop_token_ids=(tokenizer.eos_token_id,), **kw)


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


def check_episode_tokens(episode, backend: RecordingBackend, tokenizer) -> None:
    """token_ids == prompt + turn 1 + observation 1 + turn 2 + ..., exactly, with exact mask and logprobs."""
    prompt = tokenizer.apply_chat_template(episode.sample.messages, add_generation_prompt=True, return_dict=False)
    assert episode.token_ids[: episode.prompt_length] == list(prompt)
    assert len(episode.token_ids) == len(episode.loss_mask) == len(episode.gen_logprobs)
    turns = runs(episode.loss_mask)
    assert len(turns) == episode.num_turns
    observations = [m for m in episode.messages[len(episode.sample.messages):] if m["role"] != "assistant"]
    for t, (start, end) in enumerate(turns):
        prefix, generated = episode.token_ids[:start], episode.token_ids[start:end]
        matches = [c for prompts, _, result in backend.calls for p, group in zip(prompts, result)
                   if p == prefix for c in group if c.token_ids[: len(generated)] == generated]
        assert matches, f"turn {t} of episode {episode.group_id}/{episode.sample_index} was not generated"
        # Exactly the logprobs of that completion (greedy twins in one call may differ in the last bits).
        assert any(episode.gen_logprobs[start:end] == c.logprobs[: len(generated)] for c in matches)
        next_start = turns[t + 1][0] if t + 1 < len(turns) else len(episode.token_ids)
        between = episode.token_ids[end:next_start]
        if t + 1 < len(turns):
            obs = observations[t]
            assert between == expected_between_turns(tokenizer, generated, obs["role"], obs["content"])
        else:
            assert between == [] or episode.truncated  # an observation cut by max_total_length
    assert all(lp == 0.0 for lp, m in zip(episode.gen_logprobs, episode.loss_mask) if not m)


def test_single_turn_tokens_logprobs_and_groups(engine, tokenizer):
    backend = RecordingBackend(engine)
    samples = ArithmeticDatasetConfig().build("test", 3)
    episodes = run_rollouts(backend, tokenizer, samples, ArithmeticEnvironment(answer_format="either"),
                            sampling(tokenizer), num_generations_per_prompt=2)
    assert [(e.group_id, e.sample_index) for e in episodes] == [(g, s) for g in range(3) for s in range(2)]
    assert len(backend.calls) == 1 and backend.calls[0][1].n == 2  # one call, samples share the prefill
    for episode in episodes:
        check_episode_tokens(episode, backend, tokenizer)
        assert episode.num_turns == 1 and not episode.env_error
        assert set(episode.reward_components) == {"correct", "format"}
        completion = backend.calls[0][2][episode.group_id][episode.sample_index]
        assert episode.token_ids[episode.prompt_length:] == completion.token_ids
        assert episode.truncated == (completion.finish_reason == "length")


def test_multi_turn_sliding_puzzle_bookkeeping(engine, tokenizer):
    backend = RecordingBackend(engine)
    samples = SlidingPuzzleDatasetConfig(scramble_moves=6).build("train", 2)
    episodes = run_rollouts(backend, tokenizer, samples, {"sliding_puzzle": SlidingPuzzleEnvironment()},
                            sampling(tokenizer, max_new_tokens=6), num_generations_per_prompt=2, max_turns=3)
    assert len(backend.calls) == 3  # all episodes' next turns batched into one call per turn
    for episode in episodes:
        check_episode_tokens(episode, backend, tokenizer)
        assert episode.num_turns == 3 and episode.max_turns_reached  # the random model never solves it
        assert episode.metrics["invalid_moves"] >= 1
        assert [m["role"] for m in episode.messages[1:]] == ["assistant", "user", "assistant", "user", "assistant"]
        assert episode.response_length == sum(episode.loss_mask) <= 18


def test_env_workers_process_pool_gives_the_same_episodes(engine, tokenizer):
    samples = SlidingPuzzleDatasetConfig(scramble_moves=6).build("train", 2)
    args = (tokenizer, samples, SlidingPuzzleEnvironment(), sampling(tokenizer, max_new_tokens=5, seed=7))
    in_process = run_rollouts(engine, *args, num_generations_per_prompt=2, max_turns=2)
    pooled = run_rollouts(engine, *args, num_generations_per_prompt=2, max_turns=2, env_workers=1)
    assert [e.token_ids for e in pooled] == [e.token_ids for e in in_process]
    assert [e.metrics for e in pooled] == [e.metrics for e in in_process]


def test_max_total_length_truncates(engine, tokenizer):
    samples = SlidingPuzzleDatasetConfig(scramble_moves=6).build("train", 1)
    prompt_length = len(ChatTokens(tokenizer).prompt_tokens(samples[0].messages))
    backend = RecordingBackend(engine)
    short = run_rollouts(backend, tokenizer, samples, SlidingPuzzleEnvironment(), sampling(tokenizer, max_new_tokens=16),
                         num_generations_per_prompt=2, max_turns=1, max_total_length=prompt_length + 5)
    assert all(len(e.token_ids) == prompt_length + 5 and e.truncated and e.response_length == 5 for e in short)
    for e in short:
        check_episode_tokens(e, backend, tokenizer)
    # Cut inside the second turn's observation: the run stops there, marked truncated.
    limit = prompt_length + 4 + 10
    multi = run_rollouts(backend, tokenizer, samples, SlidingPuzzleEnvironment(), sampling(tokenizer, max_new_tokens=4),
                         num_generations_per_prompt=1, max_turns=4, max_total_length=limit)
    assert len(multi[0].token_ids) == limit and multi[0].truncated and multi[0].num_turns == 1
    assert multi[0].response_length == 4
    none_left = run_rollouts(engine, tokenizer, samples, SlidingPuzzleEnvironment(), sampling(tokenizer),
                             num_generations_per_prompt=1, max_total_length=prompt_length)
    assert none_left[0].truncated and none_left[0].num_turns == 0 and none_left[0].token_ids[prompt_length:] == []


class Raises:
    def step(self, messages, metadata, state):
        raise RuntimeError("environment bug")


class Hangs:
    def step(self, messages, metadata, state):
        time.sleep(30)
        return StepResult(reward=1.0)


class Garbage:
    def __init__(self, value):
        self.value = value

    def step(self, messages, metadata, state):
        return self.value


def test_environment_faults_are_isolated(engine, tokenizer):
    environments = {
        "ok": ArithmeticEnvironment(answer_format="either"),
        "raises": Raises(),
        "hangs": Hangs(),
        "none": Garbage(None),
        "nan": Garbage(StepResult(reward=math.nan)),
        "bad_component": Garbage(StepResult(reward=1.0, reward_components={"x": "high"})),
        "no_observation": Garbage(StepResult(reward=0.0, done=False)),
        "bad_fn": reward_function_environment("time:sleep"),  # wrong signature: raises TypeError
    }
    base = ArithmeticDatasetConfig().build("validation", 1)[0]
    samples = [PromptSample(messages=base.messages, metadata=base.metadata, env=name) for name in environments]
    start = time.monotonic()
    episodes = run_rollouts(engine, tokenizer, samples, environments, sampling(tokenizer),
                            num_generations_per_prompt=2, max_turns=2, env_timeout_s=1.0)
    assert time.monotonic() - start < 25  # the hung environment was abandoned after its timeout
    by_env = {}
    for episode in episodes:
        by_env.setdefault(episode.sample.env, []).append(episode)
    assert not any(e.env_error for e in by_env["ok"])
    for name in environments:
        if name != "ok":
            assert all(e.env_error and e.reward == 0.0 and e.error for e in by_env[name]), name
    assert "did not answer within 1 s" in by_env["hangs"][0].error
    assert "RuntimeError: environment bug" in by_env["raises"][0].error
    assert "non-finite" in by_env["nan"][0].error
    metrics = rollout_metrics(episodes)
    assert metrics["env_errors"] == 14.0 and metrics["env_error_fraction"] == 14 / 16


def test_unknown_environment_name_is_a_clear_error(engine, tokenizer):
    sample = PromptSample(messages=[{"role": "user", "content": "hi"}], env="chess")
    with pytest.raises(KeyError, match="'chess'"):
        run_rollouts(engine, tokenizer, [sample], {"arithmetic": ArithmeticEnvironment()}, sampling(tokenizer),
                     num_generations_per_prompt=1)


def test_template_that_rewrites_history_is_rejected(tokenizer):
    import copy

    rewriting = copy.deepcopy(tokenizer)
    # Like templates that drop earlier assistant turns' reasoning: earlier turns render differently later.
    rewriting.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ '<|im_start|>assistant\n(earlier)<|im_end|>\n' }}{% else %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    chat = ChatTokens(rewriting)
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(TemplateNotAppendOnlyError, match="not append-only"):
        chat.between_turns(conversation, tokenizer.encode("hello"), {"role": "user", "content": "again"})


def test_episodes_to_batch_and_metrics(engine, tokenizer):
    samples = SlidingPuzzleDatasetConfig(scramble_moves=6).build("train", 2)
    episodes = run_rollouts(engine, tokenizer, samples, SlidingPuzzleEnvironment(), sampling(tokenizer, max_new_tokens=4),
                            num_generations_per_prompt=2, max_turns=2)
    episodes[1].token_ids = episodes[1].token_ids[:-3]  # make lengths differ to see the padding
    episodes[1].loss_mask, episodes[1].gen_logprobs = episodes[1].loss_mask[:-3], episodes[1].gen_logprobs[:-3]
    batch = episodes_to_batch(episodes, pad_token_id=tokenizer.pad_token_id)
    width = max(len(e.token_ids) for e in episodes)
    assert batch["input_ids"].shape == (4, width)
    for row, e in enumerate(episodes):
        n = len(e.token_ids)
        assert batch["input_ids"][row, :n].tolist() == e.token_ids
        assert (batch["input_ids"][row, n:] == tokenizer.pad_token_id).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
        assert batch["loss_mask"][row, :n].tolist() == [float(m) for m in e.loss_mask]
        assert torch.equal(batch["gen_logprobs"][row, :n], torch.tensor(e.gen_logprobs, dtype=torch.float32))
        assert batch["response_lengths"][row] == e.response_length == batch["loss_mask"][row].sum()
    assert batch["group_ids"].tolist() == [0, 0, 1, 1] and batch["sample_indices"].tolist() == [0, 1, 0, 1]
    assert batch["num_turns"].tolist() == [2, 2, 2, 2]
    assert batch["reward_component.solved"].tolist() == [0.0] * 4
    metrics = rollout_metrics(episodes)
    assert metrics["episodes"] == 4 and metrics["num_turns_mean"] == 2.0
    assert metrics["response_length_mean"] == sum(e.response_length for e in episodes) / 4
    assert metrics["env/invalid_moves"] == sum(e.metrics["invalid_moves"] for e in episodes) / 4


# ---------------------------------------------------------------------------------------------------
# A tiny model trained (in the fixture, a few seconds) to follow two scripts, so that real multi-turn
# episodes happen: a tool call, then the answer; two sliding-puzzle moves that solve the board.


def _scripts(tokenizer):
    from rl_environments import ToolsEnvironment, sliding_puzzle_split, tools_split

    tools_sample = tools_split(size=1)[0]
    a = tools_sample.metadata["problem"]
    call = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a}"}}}}</tool_call>'
    tool_obs = ToolsEnvironment().step([*tools_sample.messages, {"role": "assistant", "content": call}],
                                       tools_sample.metadata, None)
    tools_script = [call, tool_obs, "The answer is \\boxed{" + tools_sample.metadata["answer"] + "}."]
    puzzle = sliding_puzzle_split(SlidingPuzzleDatasetConfig(seed=0, scramble_moves=2), "train", 50)
    puzzle_sample = next(s for s in puzzle if s.metadata["board"] == [1, 2, 3, 4, 5, 6, 0, 7, 8])
    first = SlidingPuzzleEnvironment().step([{"role": "assistant", "content": "<move>left</move>"}],
                                            puzzle_sample.metadata, None)
    puzzle_script = ["<move>left</move>", first, "<move>left</move>"]
    return [(tools_sample, tools_script), (puzzle_sample, puzzle_script)]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, tokenizer):
    """(model dir, [(sample, [assistant 1, StepResult 1, assistant 2])]) with a model that learned the scripts."""
    from rl_core.models import build_tiny_model

    scripts = _scripts(tokenizer)
    rows, targets = [], []
    for sample, (first, observation, second) in scripts:
        conversation = [*sample.messages, {"role": "assistant", "content": first},
                        {"role": observation.observation_role, "content": observation.observation},
                        {"role": "assistant", "content": second}]
        ids = tokenizer.apply_chat_template(conversation, return_dict=False)
        labels = [-100] * len(ids)  # learn the assistant turns (content + end-of-turn token) only
        for i, message in enumerate(conversation):
            if message["role"] == "assistant":
                begin = len(tokenizer.apply_chat_template(conversation[:i], add_generation_prompt=True, return_dict=False))
                stop = len(tokenizer.apply_chat_template(conversation[: i + 1], return_dict=False)) - 1
                labels[begin:stop] = ids[begin:stop]
        rows.append(ids)
        targets.append(labels)
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    model = build_tiny_model(tokenizer, seed=1).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # much faster than 2 contended threads for a model this small
    try:
        for _ in range(400):
            out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            # Done when greedy decoding reproduces every target token with a clear margin.
            probs = out.logits[:, :-1].softmax(-1)
            mask = labels[:, 1:] != -100
            target_probs = probs.gather(-1, labels[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1)[mask]
            if target_probs.min() > 0.7:
                break
    finally:
        torch.set_num_threads(threads)
    path = tmp_path_factory.mktemp("scripted")
    model.eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), scripts


def test_multi_turn_tool_use_with_a_trained_model(scripted, tokenizer):
    from rl_backends_gen.native import NativeEngine
    from rl_environments import ToolsEnvironment

    path, scripts = scripted
    backend = RecordingBackend(NativeEngine(path, seed=0))
    (tools_sample, tools_script), (puzzle_sample, puzzle_script) = scripts
    greedy = SamplingParams(max_new_tokens=96, temperature=0.0, stop_token_ids=(tokenizer.eos_token_id,))
    episodes = run_rollouts(backend, tokenizer, [tools_sample, puzzle_sample],
                            {"tools": ToolsEnvironment(), "sliding_puzzle": SlidingPuzzleEnvironment()}, greedy,
                            num_generations_per_prompt=2, max_turns=4, stop_strings_per_turn=["</tool_call>"])
    tools_episode, puzzle_episode = episodes[0], episodes[2]
    assert [m["content"] for m in tools_episode.messages if m["role"] == "assistant"] == [tools_script[0], tools_script[2]]
    assert tools_episode.messages[len(tools_sample.messages) + 1] == {"role": "tool", "content": tools_script[1].observation}
    assert tools_episode.num_turns == 2 and tools_episode.reward == 1.0
    assert tools_episode.reward_components == {"correct": 1.0, "format": 1.0}
    assert tools_episode.metrics["tool_calls"] == 0.0  # the last step's metrics: the answer turn
    assert puzzle_episode.num_turns == 2 and puzzle_episode.reward == 1.0 and puzzle_episode.metrics["moves"] == 2.0
    for episode in episodes:
        check_episode_tokens(episode, backend, tokenizer)
        assert not episode.truncated and not episode.env_error
    # The tool call ended at the stop string (no end-of-turn token): the template's "<|im_end|>\n" was added.
    first_turn_end = runs(tools_episode.loss_mask)[0][1]
    assert tokenizer.decode(tools_episode.token_ids[first_turn_end - 12:first_turn_end]).endswith("</tool_call>")
    assert tools_episode.token_ids[first_turn_end] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tools_episode.loss_mask[first_turn_end] == 0
