"""Multi-turn rollouts: generate, let environments answer, append their replies as tokens, repeat.

The loop (``run_rollouts``):

1. every prompt is generated ``num_generations_per_prompt`` times in one call (they share the prefill);
2. each finished turn is handed to its environment at once (threads, processes or Ray actors), so
   environments work while the engine generates the next turns of other episodes;
3. episodes whose environment replied are batched into the next generate call; episodes end when the
   environment says done, at ``max_turns``, at ``max_total_length`` or on an environment error.

Generated tokens are kept exactly as sampled; observations are tokenised with the chat template
(``ChatTokens.between_turns``) and masked out of the loss.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rl_algorithms.rollout.chat_tokens import ChatTokens
from rl_algorithms.rollout.env_runner import SINGLE_ENV, EnvRunner, StepRunner, check_step_result, environment_map
from rl_algorithms.rollout.episode import Episode
from rl_algorithms.rollout.image_prompts import cut_at_placeholders, generation_prompt
from rl_core.protocols import Environment, GenerationBackend
from rl_core.types import Completion, PromptSample, SamplingParams
from rl_core.vision_inputs import EncodedChat

logger = logging.getLogger(__name__)

# After the first environment task of a wave completes, wait this long for more before generating,
# so fast environments' episodes share one generate call while a slow one keeps working.
_BATCH_GRACE_S = 0.05
_TURN_SEED_STRIDE = 7_777_777


@dataclasses.dataclass
class _Live:
    """An episode in flight."""

    episode: Episode
    env_name: str
    state: dict | None = None
    final_turn: bool = False
    """This is the last turn whatever the environment says (length or turn limit reached)."""
    last_generated: list[int] = dataclasses.field(default_factory=list)
    turn_limit: bool = False
    """The latest turn was turn ``max_turns``."""


def run_rollouts(
    generation: GenerationBackend,
    tokenizer: Any,
    samples: Sequence[PromptSample],
    environments: Mapping[str, Environment] | Environment,
    sampling: SamplingParams,
    *,
    num_generations_per_prompt: int,
    max_turns: int = 1,
    max_total_length: int | None = None,
    stop_strings_per_turn: Sequence[str] = (),
    env_timeout_s: float = 30.0,
    env_workers: int = 0,
    default_env: str | None = None,
    env_runner: StepRunner | None = None,
) -> list[Episode]:
    """Episodes for every sample x generation, in order ``[sample 0 gen 0, sample 0 gen 1, ...]``.

    ``environments``: one environment for every sample, or a mapping from name to environment, with
    ``sample.env`` (or ``default_env``) choosing. ``max_total_length`` caps prompt + all turns in tokens.
    ``stop_strings_per_turn`` end a model turn (e.g. ``"</tool_call>"``) in addition to
    ``sampling.stop_strings``. ``env_workers``: 0 runs environments in threads here, > 0 in that many
    processes. Or pass a reusable ``env_runner`` (``EnvRunner``, ``RayEnvRunner``, or one built by
    ``EnvRunnerConfig.build``): it is left running, with workers lost to hung tasks replaced.
    ``env_timeout_s`` counts from the moment a task is submitted, so a runner needs enough workers
    for the tasks of one turn to start in time.
    """
    if num_generations_per_prompt < 1 or max_turns < 1:
        raise ValueError("num_generations_per_prompt and max_turns must be >= 1")
    env_map = environment_map(environments)
    chat = ChatTokens(tokenizer)
    live = _start_episodes(samples, env_map, default_env, chat, num_generations_per_prompt, max_total_length)
    turn_sampling = dataclasses.replace(sampling, stop_strings=tuple(sampling.stop_strings) + tuple(stop_strings_per_turn))
    runner = env_runner or EnvRunner(env_map, env_workers)
    if missing := sorted(set(env_map) - set(runner.environments)):
        raise ValueError(f"env_runner has no environment named {missing}: build it from the same environments "
                         "that run_rollouts gets")
    pending: dict[cf.Future, tuple[list[_Live], float]] = {}
    try:
        ready = [ep for ep in live if not ep.episode.truncated]
        turn = 0
        while ready or pending:
            if ready:
                completions = _generate(generation, ready, turn_sampling, turn, num_generations_per_prompt)
                for ep, completion in zip(ready, completions):
                    _record_turn(ep, completion, chat, max_turns, max_total_length)
                _submit_env_steps(runner, ready, pending)
                turn += 1
            ready = _collect_env_results(pending, runner, chat, env_timeout_s, max_total_length)
    finally:
        if env_runner is None:
            runner.shutdown()
        else:
            runner.recover()
    return [ep.episode for ep in live]


def _env_name(sample: PromptSample, env_map: Mapping[str, Environment], default_env: str | None) -> str:
    if list(env_map) == [SINGLE_ENV]:
        return SINGLE_ENV
    name = sample.env or default_env
    if name is None and len(env_map) == 1:
        name = next(iter(env_map))
    if name not in env_map:
        raise KeyError(f"sample asks for environment {name!r}, but run_rollouts has {sorted(env_map)}; "
                       "set sample.env or default_env to one of them")
    return name


def _start_episodes(samples, env_map, default_env, chat, num_generations, max_total_length) -> list[_Live]:
    live = []
    for group_id, sample in enumerate(samples):
        env_name = _env_name(sample, env_map, default_env)
        prompt = chat.encode_prompt(sample.messages)  # token ids, or an EncodedChat with images
        encoded = prompt if isinstance(prompt, EncodedChat) else None
        prompt = encoded.input_ids if encoded is not None else prompt
        for sample_index in range(num_generations):
            episode = Episode(sample=sample, token_ids=list(prompt), loss_mask=[0] * len(prompt),
                              gen_logprobs=[0.0] * len(prompt), prompt_length=len(prompt), group_id=group_id,
                              sample_index=sample_index, messages=[dict(m) for m in sample.messages],
                              prompt_inputs=encoded)
            if max_total_length is not None and len(prompt) >= max_total_length:
                episode.truncated = True  # no room for a single generated token
            live.append(_Live(episode, env_name))
    return live


def _generate(generation: GenerationBackend, ready: list[_Live], sampling: SamplingParams, turn: int,
              num_generations: int) -> list[Completion]:
    """One generate call for all ready episodes, completions in ``ready`` order."""
    seed = None if sampling.seed is None else sampling.seed + turn * _TURN_SEED_STRIDE
    first_turn = all(ep.episode.num_turns == 0 for ep in ready)
    if first_turn and num_generations > 1 and _whole_groups(ready, num_generations):
        prompts = [generation_prompt(ep.episode) for ep in ready[::num_generations]]
        result = generation.generate(prompts, dataclasses.replace(sampling, n=num_generations, seed=seed))
        return [completion for group in result for completion in group]
    result = generation.generate([generation_prompt(ep.episode) for ep in ready],
                                 dataclasses.replace(sampling, n=1, seed=seed))
    return [group[0] for group in result]


def _whole_groups(ready: list[_Live], num_generations: int) -> bool:
    """``ready`` is complete groups in order (so one prompt with n samples stands for each group)."""
    if len(ready) % num_generations:
        return False
    return all(ep.episode.group_id == ready[i - i % num_generations].episode.group_id
               and ep.episode.sample_index == i % num_generations for i, ep in enumerate(ready))


def _record_turn(ep: _Live, completion: Completion, chat: ChatTokens, max_turns: int,
                 max_total_length: int | None) -> None:
    """Append the model's tokens exactly as generated; decide whether this must be the last turn."""
    episode = ep.episode
    tokens, logprobs = list(completion.token_ids), list(completion.logprobs)
    if len(tokens) != len(logprobs):
        raise ValueError(f"generation backend returned {len(tokens)} tokens but {len(logprobs)} logprobs")
    tokens, logprobs, cut = cut_at_placeholders(chat.tokenizer, tokens, logprobs)  # a VLM's image tokens
    hit_length = completion.finish_reason == "length" or cut
    if max_total_length is not None and len(episode.token_ids) + len(tokens) > max_total_length:
        keep = max_total_length - len(episode.token_ids)
        tokens, logprobs, hit_length = tokens[:keep], logprobs[:keep], True
    episode.token_ids += tokens
    episode.loss_mask += [1] * len(tokens)
    episode.gen_logprobs += logprobs
    if completion.routed_experts is not None:
        episode.routed_experts = completion.routed_experts[: len(episode.token_ids)]
    episode.num_turns += 1
    episode.messages.append({"role": "assistant", "content": chat.tokenizer.decode(tokens, skip_special_tokens=True)})
    ep.last_generated = tokens
    at_length_cap = max_total_length is not None and len(episode.token_ids) >= max_total_length
    # A turn cut at max_new_tokens still goes to the environment, which may ask for another turn;
    # the episode counts as truncated when its last turn was cut (or it ran out of total length).
    episode.truncated = hit_length or at_length_cap
    ep.turn_limit = episode.num_turns >= max_turns
    ep.final_turn = at_length_cap or ep.turn_limit


def _submit_env_steps(runner: StepRunner, turned: list[_Live], pending: dict) -> None:
    """One task per episode, or one per environment for environments that grade in batches."""
    by_env: dict[str, list[_Live]] = {}
    for ep in turned:
        by_env.setdefault(ep.env_name, []).append(ep)
    now = time.monotonic()
    for name, eps in by_env.items():
        batched = hasattr(runner.environments[name], "step_batch")
        groups = [eps] if batched else [[ep] for ep in eps]
        for group in groups:
            items = [(list(ep.episode.messages), dict(ep.episode.sample.metadata), ep.state) for ep in group]
            pending[runner.submit(name, items)] = (group, now)


def _collect_env_results(pending: dict, runner: StepRunner, chat: ChatTokens, timeout_s: float,
                         max_total_length: int | None) -> list[_Live]:
    """Wait for environment results (at least one, or a timeout); return episodes ready for another turn."""
    if not pending:
        return []
    oldest = min(start for _, start in pending.values())
    done, _ = cf.wait(list(pending), timeout=max(oldest + timeout_s - time.monotonic(), 0),
                      return_when=cf.FIRST_COMPLETED)
    if done and len(done) < len(pending):
        more, _ = cf.wait([f for f in pending if f not in done], timeout=_BATCH_GRACE_S, return_when=cf.ALL_COMPLETED)
        done |= more
    ready: list[_Live] = []
    now = time.monotonic()
    for future in list(pending):
        group, start = pending[future]
        if future in done:
            del pending[future]
            ready += _apply_results(group, future, chat, max_total_length)
        elif now - start >= timeout_s:
            del pending[future]
            future.cancel()
            runner.abandon(future)
            for ep in group:
                _fail(ep, f"environment {ep.env_name!r} did not answer within {timeout_s:g} s")
    return ready


def _apply_results(group: list[_Live], future: cf.Future, chat: ChatTokens, max_total_length: int | None) -> list[_Live]:
    try:
        results = future.result()
    except BaseException as err:  # noqa: BLE001 - an environment's failure must not stop the run
        for ep in group:
            _fail(ep, f"environment {ep.env_name!r} raised {type(err).__name__}: {err}")
        return []
    if not isinstance(results, list) or len(results) != len(group):
        for ep in group:
            _fail(ep, f"environment {ep.env_name!r} returned {len(results) if isinstance(results, list) else results!r} "
                      f"results for {len(group)} episodes")
        return []
    ready = []
    for ep, result in zip(group, results):
        problem = check_step_result(result)
        if problem is not None:
            _fail(ep, problem)
            continue
        episode = ep.episode
        episode.reward += float(result.reward)
        for name, value in result.reward_components.items():
            episode.reward_components[name] = episode.reward_components.get(name, 0.0) + float(value)
        episode.metrics.update({k: float(v) for k, v in result.metrics.items()})
        ep.state = result.state
        if result.done or ep.final_turn:
            episode.max_turns_reached = not result.done and ep.turn_limit
            continue
        episode.truncated = False  # the environment accepted the turn and continues
        if _append_observation(ep, result.observation, result.observation_role, chat, max_total_length):
            ready.append(ep)
    return ready


def _append_observation(ep: _Live, text: str, role: str, chat: ChatTokens, max_total_length: int | None) -> bool:
    """Append the environment's reply and the next assistant header; False when no room is left."""
    episode = ep.episode
    message = {"role": role, "content": text}
    tokens = chat.between_turns(episode.messages, ep.last_generated, message)
    episode.messages.append(message)
    episode.token_ids += tokens
    episode.loss_mask += [0] * len(tokens)
    episode.gen_logprobs += [0.0] * len(tokens)
    if max_total_length is not None and len(episode.token_ids) >= max_total_length:
        del episode.token_ids[max_total_length:], episode.loss_mask[max_total_length:]
        del episode.gen_logprobs[max_total_length:]
        episode.truncated = True
        return False
    return True


def _fail(ep: _Live, reason: str) -> None:
    logger.warning("episode %d/%d: %s; reward 0", ep.episode.group_id, ep.episode.sample_index, reason)
    episode = ep.episode
    episode.env_error, episode.error = True, reason
    episode.reward = 0.0
    episode.reward_components = {k: 0.0 for k in episode.reward_components}
