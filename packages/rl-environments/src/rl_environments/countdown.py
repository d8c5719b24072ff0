"""Countdown: reach a target number with arithmetic on given numbers, each used exactly once.

The model answers with an expression in ``\\boxed{}`` (e.g. ``\\boxed{(25 - 5) * 4}``); it is
evaluated with the safe calculator. Every start is solvable: the target is computed from a random
expression over the numbers.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from typing import Literal

from pydantic import Field

from rl_core.types import PromptSample, StepResult
from rl_environments.answers import extract_boxed, last_assistant_text
from rl_environments.calculator import CalculatorError, evaluate, numbers_used
from rl_environments.dataset_base import PromptDatasetConfig
from rl_environments.prompts import user_messages
from rl_environments.splits import Split, generate_split


class CountdownDatasetConfig(PromptDatasetConfig):
    """Settings of the procedural countdown dataset."""

    kind: Literal["countdown"] = "countdown"
    seed: int = 0
    num_operands: int = Field(3, ge=2, le=6)
    """How many numbers are given."""
    max_number: int = Field(20, ge=2, le=1000)
    """Numbers are drawn from 1 .. max_number."""
    operators: list[Literal["+", "-", "*", "/"]] = Field(default_factory=lambda: ["+", "-", "*"], min_length=1)
    train_size: int = Field(10000, gt=0)
    validation_size: int = Field(200, ge=0)
    test_size: int = Field(200, ge=0)
    system_prompt: str | None = None

    def generate(self, split: Split, size: int | None) -> list[PromptSample]:
        return countdown_split(self, split, size)


def make_problem(rng: random.Random, cfg: CountdownDatasetConfig) -> tuple[tuple[int, ...], int]:
    """Numbers and a reachable, positive integer target."""
    while True:
        numbers = [rng.randint(1, cfg.max_number) for _ in range(cfg.num_operands)]
        order = numbers[:]
        rng.shuffle(order)
        value = Fraction(order[0])
        for n in order[1:]:
            op = rng.choice(cfg.operators)
            if op == "/" and (value % n != 0):
                op = "+"
            value = {"+": value + n, "-": value - n, "*": value * n, "/": value / n if n else value}[op]
        if value > 0 and value.denominator == 1:
            return tuple(sorted(numbers)), int(value)


def countdown_split(cfg: CountdownDatasetConfig, split: Split, size: int | None = None) -> list[PromptSample]:
    """The ``split`` of the countdown dataset (distinct (numbers, target) pairs, disjoint splits)."""
    size = getattr(cfg, f"{split}_size") if size is None else size
    problems = generate_split(lambda rng: make_problem(rng, cfg), lambda p: f"{p[0]}->{p[1]}", seed=cfg.seed,
                              split=split, size=size,
                              name=f"countdown-n{cfg.num_operands}-m{cfg.max_number}-{''.join(cfg.operators)}")
    return [_sample(numbers, target, cfg) for numbers, target in problems]


def _sample(numbers: tuple[int, ...], target: int, cfg: CountdownDatasetConfig) -> PromptSample:
    ops = " ".join(cfg.operators)
    question = (f"Using the numbers {', '.join(map(str, numbers))}, each exactly once, and the operations {ops}, "
                f"make {target}. Put your final expression in \\boxed{{}}, for example \\boxed{{(1 + 2) * 3}}.")
    return PromptSample(messages=user_messages(question, cfg.system_prompt),
                        metadata={"numbers": list(numbers), "target": target}, env="countdown")


def check_expression(expression: str, numbers: list[int], target: int, use_all_numbers: bool = True) -> bool:
    """True when ``expression`` uses the numbers (each once; all of them if ``use_all_numbers``) and equals target."""
    try:
        used = numbers_used(expression)
        value = evaluate(expression, allow_functions=False)
    except CalculatorError:
        return False
    if any(not isinstance(u, int) for u in used):  # "4.0" is not the given number 4
        return False
    used_counts, given = Counter(int(u) for u in used), Counter(numbers)
    if use_all_numbers and used_counts != given:
        return False
    if any(used_counts[n] > given[n] for n in used_counts):
        return False
    return value == target


class CountdownEnvironment:
    """Single-turn grader: ``correct`` (the boxed expression is valid and reaches the target) and
    ``format`` (a ``\\boxed{}`` is present). Reward = correct + format_weight * format."""

    def __init__(self, use_all_numbers: bool = True, format_weight: float = 0.0):
        self.use_all_numbers = use_all_numbers
        self.format_weight = float(format_weight)

    def step(self, messages, metadata, state) -> StepResult:
        expression = extract_boxed(last_assistant_text(messages))
        fmt = float(expression is not None)
        if expression is not None and "=" in expression:  # "(25 - 5) * 4 = 80": grade the left side
            expression = expression.split("=")[0]
        correct = float(expression is not None and check_expression(
            expression, list(metadata["numbers"]), int(metadata["target"]), self.use_all_numbers))
        return StepResult(reward=correct + self.format_weight * fmt,
                          reward_components={"correct": correct, "format": fmt}, done=True)
