"""``evaluate``: generate n samples per item with any GenerationBackend, grade them, compute metrics.

The metrics come from :func:`evaluate_rollouts`, which takes the samples from any ``rollout`` function:
``evaluate`` uses single-turn generation and grading; GRPO's validation passes its multi-turn rollouts
(environments, turn and length limits). So a number in a training log and a number from ``rl eval``
are computed by the same code and mean the same thing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rl_core.images import jsonable_messages
from rl_core.protocols import Environment, GenerationBackend, Prompt
from rl_core.types import PromptSample, SamplingParams
from rl_eval.errors import EvalError
from rl_eval.graders import voting_answer
from rl_eval.metrics import cons_at_k, mean_at_k, pass_at_k


@dataclass
class SampleResult:
    text: str
    answer: str | None
    """The extracted answer this sample votes for in cons@k."""
    correct: bool
    reward: float
    num_tokens: int
    """Tokens the model generated (over all turns)."""
    finish_reason: str
    reward_components: dict[str, float] = field(default_factory=dict)
    truncated: bool = False
    """Ended by a token or length limit rather than by the model or the environment."""


Rollout = Callable[[Sequence[PromptSample], SamplingParams], list[list[SampleResult]]]
"""``rollout(items, sampling)``: ``sampling.n`` graded samples of every item, ``result[i][j]``."""


def graded_sample(text: str, reward: float, reward_components: dict[str, float], num_tokens: int, finish_reason: str,
                  *, answer_format: str = "boxed", truncated: bool = False, threshold: float = 0.5) -> SampleResult:
    """A sample as evaluation counts it: correct when the grader's ``correct`` component (or its reward,
    when it has none) is at least ``threshold``; its voting answer extracted with ``answer_format``."""
    score = reward_components.get("correct", reward)
    return SampleResult(text=text, answer=voting_answer(text, answer_format), correct=bool(score >= threshold),
                        reward=float(reward), num_tokens=num_tokens, finish_reason=finish_reason,
                        reward_components=dict(reward_components), truncated=truncated)


@dataclass
class ItemResult:
    index: int
    messages: list[dict[str, str]]
    reference: str | None
    samples: list[SampleResult]
    metrics: dict[str, float]
    greedy: SampleResult | None = None

    @property
    def num_correct(self) -> int:
        return sum(s.correct for s in self.samples)


@dataclass
class EvalReport:
    """Metrics of one model on one dataset, with every item's samples and grades."""

    model: str
    dataset: str
    sampling: dict
    num_samples: int
    k_values: list[int]
    metrics: dict[str, float]
    """``pass@k``, ``cons@k``, ``mean@k`` for each k (and ``greedy`` when run): means over items."""
    items: list[ItemResult] = field(default_factory=list)

    @property
    def num_items(self) -> int:
        return len(self.items)

    def summary_lines(self) -> list[str]:
        """One line per metric: ``model=... dataset=... temperature=... n=... pass@4 score=0.4531 (29/64)``."""
        head = (f"model={self.model} dataset={self.dataset} temperature={self.sampling['temperature']} "
                f"top_p={self.sampling['top_p']} max_new_tokens={self.sampling['max_new_tokens']} n={self.num_samples}")
        lines = []
        for name, score in self.metrics.items():
            total = score * self.num_items
            count = f"{round(total)}" if abs(total - round(total)) < 1e-6 else f"{total:.2f}"
            lines.append(f"{head} {name} score={score:.4f} ({count}/{self.num_items})")
        return lines

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self) | {"num_items": self.num_items}
        for item in out["items"]:  # images as their sizes
            item["messages"] = jsonable_messages(item["messages"])
        return out

    def sample_metrics(self) -> dict[str, float]:
        """Means over every sample: ``reward_mean``, ``response_length_mean``, ``truncated_fraction`` and
        ``reward/<name>`` for each reward component."""
        samples = [s for item in self.items for s in item.samples]
        metrics = {"reward_mean": _mean(s.reward for s in samples),
                   "response_length_mean": _mean(s.num_tokens for s in samples),
                   "truncated_fraction": _mean(float(s.truncated) for s in samples)}
        for name in sorted({k for s in samples for k in s.reward_components}):
            metrics[f"reward/{name}"] = _mean(s.reward_components.get(name, 0.0) for s in samples)
        return metrics


def evaluate(generation: GenerationBackend, tokenizer, dataset: Sequence[PromptSample], grader: Environment,
             sampling: SamplingParams, k_values: Sequence[int] = (1,), *, model_name: str = "model",
             dataset_name: str = "dataset", answer_format: str = "boxed", greedy: bool = False,
             batch_size: int = 32, prompt_template: str | None = None, progress: bool = False,
             correct_threshold: float = 0.5) -> EvalReport:
    """Evaluate ``generation`` on ``dataset``: ``sampling.n`` samples per item, graded by ``grader``.

    Args:
        tokenizer: renders each item's messages with its chat template (and decodes when the backend
            returns no text).
        k_values: every k gets pass@k (unbiased), cons@k (majority vote over extracted answers, ties to
            the answer seen first) and mean@k; each k must be <= ``sampling.n``.
        answer_format: how a sample's answer is extracted for voting: boxed, last_number, either, choice.
        greedy: also run one greedy sample per item and report ``greedy`` accuracy.
        batch_size: items per ``generate`` call. Item i's samples use seed ``sampling.seed + i``
            whatever the batching, so the same seed gives the same report.
        prompt_template: a format string for the last user message, e.g. ``"Q: {question}\\nA:"``
            (``{question}`` is the message text; metadata fields may be named too).
        correct_threshold: a sample is correct when the grader's ``correct`` component (or its reward,
            when it has no such component) is at least this.
    """
    def rollout(items: Sequence[PromptSample], params: SamplingParams) -> list[list[SampleResult]]:
        prompts = [render_prompt(tokenizer, sample, prompt_template) for sample in items]
        _check_prompts_fit(prompts, getattr(generation, "max_seq_len", None), dataset_name)
        desc = f"{'greedy' if params.temperature == 0 else 'eval'} {dataset_name}"
        completions = _generate(generation, prompts, params, batch_size, progress, desc)
        return [[_grade(tokenizer, grader, sample, c, answer_format, correct_threshold) for c in per_item]
                for sample, per_item in zip(items, completions)]

    return evaluate_rollouts(rollout, dataset, sampling, k_values, model_name=model_name, dataset_name=dataset_name,
                             greedy=greedy)


def evaluate_rollouts(rollout: Rollout, dataset: Sequence[PromptSample], sampling: SamplingParams,
                      k_values: Sequence[int] = (1,), *, model_name: str = "model", dataset_name: str = "dataset",
                      greedy: bool = False) -> EvalReport:
    """The report of ``sampling.n`` samples per item from ``rollout``: pass@k, cons@k and mean@k for each
    k, and with ``greedy`` the accuracy of one more greedy sample per item."""
    sampling.validate()
    k_values = sorted(set(k_values))
    if not dataset:
        raise EvalError(f"dataset {dataset_name!r} is empty; nothing to evaluate")
    for k in k_values:
        if not 1 <= k <= sampling.n:
            raise EvalError(f"k={k} needs at least k samples per item but n={sampling.n}; raise n or lower k")
    results = rollout(dataset, sampling)
    greedy_results = None
    if greedy:
        greedy_sampling = dataclasses.replace(sampling, temperature=0.0, n=1, top_p=1.0, top_k=0, min_p=0.0)
        greedy_results = rollout(dataset, greedy_sampling)
    items = []
    for i, sample in enumerate(dataset):
        item = ItemResult(index=i, messages=sample.messages, reference=_reference(sample), samples=results[i],
                          metrics=item_metrics(results[i], k_values))
        if greedy_results is not None:
            item.greedy = greedy_results[i][0]
            item.metrics["greedy"] = float(item.greedy.correct)
        items.append(item)
    names = list(items[0].metrics)
    metrics = {name: sum(item.metrics[name] for item in items) / len(items) for name in names}
    sampling_dict = {k: v for k, v in dataclasses.asdict(sampling).items() if k not in ("stop_token_ids",)}
    return EvalReport(model=model_name, dataset=dataset_name, sampling=sampling_dict, num_samples=sampling.n,
                      k_values=k_values, metrics=metrics, items=items)


def item_metrics(results: list[SampleResult], k_values: Sequence[int]) -> dict[str, float]:
    correct = [r.correct for r in results]
    answers = [r.answer for r in results]
    out = {}
    for k in k_values:
        out[f"pass@{k}"] = pass_at_k(len(correct), sum(correct), k)
        out[f"cons@{k}"] = cons_at_k(answers, correct, k)
        out[f"mean@{k}"] = mean_at_k(correct, k)
    return out


def render_prompt(tokenizer, sample: PromptSample, prompt_template: str | None = None) -> Prompt:
    """Token ids of the item's chat, with the generation prompt (assistant turn) opened; of a chat with images
    (a vision-language model's tokenizer), its ``EncodedChat``."""
    messages = [dict(m) for m in sample.messages]
    if prompt_template is not None:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        try:
            messages[last_user]["content"] = prompt_template.format(**sample.metadata,
                                                                    question=messages[last_user]["content"])
        except KeyError as e:
            raise EvalError(f"prompt_template names {e} but the item has only question and "
                            f"{sorted(sample.metadata)}; fix the template") from None
    encode = getattr(tokenizer, "encode_image_chat", None)  # a vision-language model: images kept (EncodedChat)
    if encode is not None:
        return encode(messages)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def _check_prompts_fit(prompts: Sequence[Prompt], context: int | None, dataset_name: str) -> None:
    """A prompt that leaves no room for one new token in the backend's context is bad input: refused before
    anything is generated (the engine would refuse it mid-run). ``context``: None when the backend does not say."""
    if context is None:
        return
    for index, prompt in enumerate(prompts):
        length = len(getattr(prompt, "input_ids", prompt))  # an EncodedChat's ids, or the ids themselves
        if length >= context:
            raise EvalError(f"dataset {dataset_name!r}, item {index + 1}: the prompt is {length} tokens, which leaves "
                            f"no room to generate in the backend's context of {context} tokens "
                            "(generation.max_seq_len, else the model's); shorten the prompt or raise "
                            "generation.max_seq_len")


def _generate(generation, prompts, sampling: SamplingParams, batch_size: int, progress: bool, desc: str):
    from tqdm.auto import tqdm

    out = []
    bar = tqdm(total=len(prompts), desc=desc, unit="item", disable=not progress)
    for start in range(0, len(prompts), batch_size):
        batch_sampling = sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + start)
        out.extend(generation.generate(prompts[start:start + batch_size], batch_sampling))
        bar.update(min(batch_size, len(prompts) - start))
    bar.close()
    return out


def _grade(tokenizer, grader, sample: PromptSample, completion, answer_format: str, threshold: float) -> SampleResult:
    text = completion.text if completion.text is not None else tokenizer.decode(completion.token_ids,
                                                                                 skip_special_tokens=True)
    step = grader.step(sample.messages + [{"role": "assistant", "content": text}], sample.metadata, None)
    return graded_sample(text, step.reward, step.reward_components, completion.num_tokens, completion.finish_reason,
                         answer_format=answer_format, truncated=completion.finish_reason == "length",
                         threshold=threshold)


def _reference(sample: PromptSample) -> str | None:
    ref = sample.metadata.get("answer", sample.metadata.get("target"))
    return None if ref is None else str(ref)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
