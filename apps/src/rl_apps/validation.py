"""GRPO's validation: rl-eval's evaluation (``rl_eval.evaluate_rollouts``) on GRPO's own rollouts.

The held-out prompts run through the same multi-turn rollouts as training (environments, turn and
length limits, the environment runner), and rl-eval turns the graded episodes into metrics, so
``val/accuracy`` and ``val/pass@k`` are computed by the code behind ``rl eval``:

* ``accuracy``: greedy pass@1 (a sample is correct when its ``correct`` reward component, or its reward
  when it has none, is at least 0.5), with ``reward_mean``, ``response_length_mean``,
  ``truncated_fraction`` and ``reward/<name>`` of the greedy episodes;
* ``pass@k`` (``grpo.val_pass_k > 1``): from k samples per prompt at the training temperature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rl_algorithms.grpo import GRPOConfig
from rl_algorithms.loop import Metrics, Validate
from rl_algorithms.rollout import run_rollouts
from rl_apps.run_setup import stop_tokens
from rl_core.types import PromptSample, SamplingParams
from rl_eval import SampleResult, evaluate_rollouts, graded_sample

_PASS_K_SEED_STRIDE = 31337


def make_validate_fn(grpo: GRPOConfig, seed: int, generation: Any, tokenizer: Any, val_data: list[PromptSample],
                     environment: Any, env_runner: Any = None) -> Validate:
    """``validate(step) -> metrics`` on ``val_data``. ``env_runner``: where ``environment`` runs (None: threads)."""

    def rollout(items: Sequence[PromptSample], sampling: SamplingParams) -> list[list[SampleResult]]:
        n = sampling.n
        episodes = run_rollouts(generation, tokenizer, items, environment, dataclasses.replace(sampling, n=1),
                                num_generations_per_prompt=n, max_turns=grpo.max_turns,
                                max_total_length=grpo.max_total_length, env_timeout_s=grpo.env_runner.timeout_s,
                                env_runner=env_runner)
        return [[episode_result(ep) for ep in episodes[i * n:(i + 1) * n]] for i in range(len(items))]

    def validate(step: int) -> Metrics:
        common = dict(max_new_tokens=grpo.max_new_tokens, stop_token_ids=stop_tokens(tokenizer),
                      stop_strings=tuple(grpo.stop_strings))
        greedy = evaluate_rollouts(rollout, val_data, SamplingParams(temperature=0.0, **common), [1],
                                   dataset_name="validation")
        metrics = {"accuracy": greedy.metrics["pass@1"], **greedy.sample_metrics()}
        k = grpo.val_pass_k
        if k > 1:
            sampling = SamplingParams(temperature=grpo.temperature, top_p=grpo.top_p, top_k=grpo.top_k, n=k,
                                      seed=seed + _PASS_K_SEED_STRIDE * (step + 1), **common)
            metrics[f"pass@{k}"] = evaluate_rollouts(rollout, val_data, sampling, [k],
                                                     dataset_name="validation").metrics[f"pass@{k}"]
        return metrics

    return validate


def episode_result(episode: Any) -> SampleResult:
    """A graded episode as rl-eval counts it (its text: the model's last turn)."""
    replies = [m["content"] for m in episode.messages[len(episode.sample.messages):] if m["role"] == "assistant"]
    return graded_sample(replies[-1] if replies else "", episode.reward, episode.reward_components,
                         episode.response_length, "length" if episode.truncated else "stop",
                         truncated=episode.truncated)
