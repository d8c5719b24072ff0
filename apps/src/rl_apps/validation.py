"""GRPO's validation: rl-eval's evaluation (``rl_eval.evaluate_rollouts``) on GRPO's own rollouts.

The held-out prompts run through the same multi-turn rollouts as training (environments, turn and
length limits, the environment runner), and rl-eval turns the graded episodes into metrics, so
``val/accuracy`` and ``val/pass@k`` are computed by the code behind ``rl eval``:

* ``accuracy``: greedy pass@1 (a sample is correct when its ``correct`` reward component, or its reward
  when it has none, is at least 0.5), with ``reward_mean``, ``response_length_mean``,
  ``truncated_fraction`` and ``reward/<name>`` of the greedy episodes;
* ``pass@k`` (``grpo.val_pass_k > 1``): from k samples per prompt at the training temperature.

With ``log`` (the run's ``MetricsLogger.log_validation``), each evaluation also records which prompts the
greedy answers got right and what they answered, one line of ``validation.jsonl`` per evaluation: a fall
in accuracy can then be read as the same prompts going wrong (the policy changed) or others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from rl_algorithms.grpo import GRPOConfig
from rl_algorithms.loop import Metrics, Validate
from rl_algorithms.rollout import run_rollouts
from rl_apps.run_setup import stop_tokens
from rl_core.types import PromptSample, SamplingParams
from rl_eval import EvalReport, SampleResult, evaluate_rollouts, graded_sample

_PASS_K_SEED_STRIDE = 31337


def make_validate_fn(grpo: GRPOConfig, seed: int, generation: Any, tokenizer: Any, val_data: list[PromptSample],
                     environment: Any, env_runner: Any = None, *, split: str = "validation",
                     log: Callable[[dict[str, Any], int], None] | None = None) -> Validate:
    """``validate(step) -> metrics`` on ``val_data``. ``env_runner``: where ``environment`` runs (None: threads).
    ``log(record, step)``: receives each evaluation's greedy outcome per prompt (``outcome_record``)."""

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
                                   dataset_name=split)
        if log is not None:
            log(outcome_record(split, greedy), step)
        metrics = {"accuracy": greedy.metrics["pass@1"], **greedy.sample_metrics()}
        k = grpo.val_pass_k
        if k > 1:
            sampling = SamplingParams(temperature=grpo.temperature, top_p=grpo.top_p, top_k=grpo.top_k, n=k,
                                      seed=seed + _PASS_K_SEED_STRIDE * (step + 1), **common)
            metrics[f"pass@{k}"] = evaluate_rollouts(rollout, val_data, sampling, [k],
                                                     dataset_name=split).metrics[f"pass@{k}"]
        return metrics

    return validate


def outcome_record(split: str, report: EvalReport) -> dict[str, Any]:
    """One evaluation's greedy outcome per prompt, in the order of the split: ``correct`` as a string of 0/1
    (compact: 256 prompts are 256 characters) and each answer as grading extracted it (None: no answer)."""
    samples = [item.samples[0] for item in report.items]
    return {"split": split, "correct": "".join("1" if s.correct else "0" for s in samples),
            "answers": [s.answer for s in samples]}


def episode_result(episode: Any) -> SampleResult:
    """A graded episode as rl-eval counts it (its text: the model's last turn)."""
    replies = [m["content"] for m in episode.messages[len(episode.sample.messages):] if m["role"] == "assistant"]
    return graded_sample(replies[-1] if replies else "", episode.reward, episode.reward_components,
                         episode.response_length, "length" if episode.truncated else "stop",
                         truncated=episode.truncated)
