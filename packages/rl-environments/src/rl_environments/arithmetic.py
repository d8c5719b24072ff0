"""Arithmetic: procedurally generated ``a op b op c`` problems graded on the final answer.

The problem space is set by ``digits`` (size of each operand), ``num_operands`` and ``operators``;
usual precedence applies (``*`` before ``+``/``-``). Answers are integers.
"""

from __future__ import annotations

import random
from typing import Literal, get_args

from pydantic import Field

from rl_core.types import PromptSample, StepResult
from rl_environments.answers import (
    AnswerFormat,
    boxed_repeats_result,
    count_boxed,
    extract_answer,
    extract_boxed,
    last_assistant_text,
    numbers_equal,
    parse_number,
)
from rl_environments.calculator import evaluate
from rl_environments.dataset_base import PromptDatasetConfig
from rl_environments.prompts import BOXED_INSTRUCTION, user_messages
from rl_environments.splits import Split, generate_split


class ArithmeticDatasetConfig(PromptDatasetConfig):
    """Settings of the procedural arithmetic dataset."""

    kind: Literal["arithmetic"] = "arithmetic"
    seed: int = 0
    """Seed of the problem space: same seed, same problems and same split assignment."""
    digits: int = Field(2, ge=1, le=9)
    """Digits per operand (operands are drawn uniformly from 0 .. 10**digits - 1)."""
    num_operands: int = Field(2, ge=2, le=8)
    operators: list[Literal["+", "-", "*"]] = Field(default_factory=lambda: ["+", "-"], min_length=1)
    """Operators to draw from."""
    train_size: int = Field(10000, gt=0)
    validation_size: int = Field(200, ge=0)
    test_size: int = Field(200, ge=0)
    system_prompt: str | None = None
    """Optional system message put before each question."""
    instruction: str = BOXED_INSTRUCTION
    """Appended to each question ``What is <problem>?`` (empty: the bare question)."""

    def generate(self, split: Split, size: int | None) -> list[PromptSample]:
        return arithmetic_split(self, split, size)


def make_problem(rng: random.Random, cfg: ArithmeticDatasetConfig) -> str:
    high = 10**cfg.digits - 1
    parts = [str(rng.randint(0, high))]
    for _ in range(cfg.num_operands - 1):
        parts += [rng.choice(cfg.operators), str(rng.randint(0, high))]
    return " ".join(parts)


def arithmetic_split(cfg: ArithmeticDatasetConfig, split: Split, size: int | None = None) -> list[PromptSample]:
    """The ``split`` of the arithmetic dataset: distinct problems, disjoint from the other splits."""
    size = getattr(cfg, f"{split}_size") if size is None else size
    problems = generate_split(lambda rng: make_problem(rng, cfg), str, seed=cfg.seed, split=split, size=size,
                              name=f"arithmetic-d{cfg.digits}-n{cfg.num_operands}-{''.join(cfg.operators)}")
    return [_sample(problem, cfg) for problem in problems]


def _sample(problem: str, cfg: ArithmeticDatasetConfig) -> PromptSample:
    answer = evaluate(problem, allow_functions=False)
    question = f"What is {problem}? {cfg.instruction}".rstrip()
    return PromptSample(messages=user_messages(question, cfg.system_prompt),
                        metadata={"answer": str(int(answer)), "problem": problem}, env="arithmetic")


FormatRule = Literal["one_box", "result_then_box"]


class ArithmeticEnvironment:
    """Single-turn grader: ``correct`` (final answer equals ``metadata['answer']``) and ``format``: with
    ``format_rule="one_box"`` exactly one ``\\boxed{}``, holding a number; with ``"result_then_box"``
    also the work first and the box restating its result (``6 + 34 = 40, so \\boxed{40}``). Reward = correct + format_weight * format, or with
    ``format_requires_correct`` correct * (1 + format_weight * format): the format bonus is paid only
    for correct answers, so boxing a wrong answer earns nothing over not boxing it."""

    def __init__(self, answer_format: AnswerFormat = "boxed", format_weight: float = 0.0,
                 format_requires_correct: bool = False, format_rule: FormatRule = "one_box"):
        if answer_format not in ("boxed", "last_number", "either"):
            raise ValueError(f"answer_format must be 'boxed', 'last_number' or 'either', got {answer_format!r}")
        if format_rule not in get_args(FormatRule):
            raise ValueError(f"format_rule must be one of {get_args(FormatRule)}, got {format_rule!r}")
        self.format_rule = format_rule
        self.answer_format = answer_format
        self.format_weight = float(format_weight)
        self.format_requires_correct = bool(format_requires_correct)

    def step(self, messages, metadata, state) -> StepResult:
        if "answer" not in metadata:
            raise KeyError("arithmetic environment needs metadata['answer']")
        text = last_assistant_text(messages)
        answer, _ = extract_answer(text, self.answer_format)
        correct = float(numbers_equal(answer, metadata["answer"]))
        if self.format_rule == "result_then_box":
            fmt = float(boxed_repeats_result(text))
        else:
            fmt = float(count_boxed(text) == 1 and parse_number(extract_boxed(text)) is not None)
        bonus = self.format_weight * fmt * (correct if self.format_requires_correct else 1.0)
        return StepResult(reward=correct + bonus,
                          reward_components={"correct": correct, "format": fmt}, done=True)
