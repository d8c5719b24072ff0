"""Graders for evaluation: rl-environments' environments, plus a multiple-choice grader, and the answer
extraction used by majority voting."""

from __future__ import annotations

import re

from rl_core.types import StepResult
from rl_environments.answers import extract_answer, extract_boxed, last_assistant_text, parse_number
from rl_environments.registry import list_environments, register_environment

_CHOICE_PATTERNS = (
    re.compile(r"answer\s*(?:is|:)?\s*\(?([A-Z])\)?(?![A-Za-z])", re.IGNORECASE),
    re.compile(r"^\s*\(?([A-Z])\)?[.):]?\s*$"),
)


def extract_choice(text: str, letters: str = "ABCD") -> str | None:
    """The chosen option letter: ``\\boxed{B}``, "the answer is (B)", or a reply that is just "B".

    >>> extract_choice("so the answer is (c).")
    'C'
    """
    boxed = extract_boxed(text)
    candidates = [boxed] if boxed is not None else []
    candidates += [m.group(1) for pattern in _CHOICE_PATTERNS for m in pattern.finditer(text)][-1:]
    for candidate in candidates:
        letter = candidate.strip().strip("()").upper()[:1] if candidate else ""
        if letter and letter in letters:
            return letter
    return None


class MultipleChoiceEnvironment:
    """Single-turn grader for lettered options: correct when the chosen letter equals ``metadata['answer']``."""

    def __init__(self, letters: str = "ABCD"):
        self.letters = letters.upper()

    def step(self, messages, metadata, state) -> StepResult:
        if "answer" not in metadata:
            raise KeyError("multiple_choice grader needs metadata['answer'] (the correct letter)")
        choice = extract_choice(last_assistant_text(messages), self.letters)
        correct = float(choice is not None and choice == str(metadata["answer"]).strip().upper())
        return StepResult(reward=correct, reward_components={"correct": correct}, done=True)


if "multiple_choice" not in list_environments():
    register_environment("multiple_choice", MultipleChoiceEnvironment)


def voting_answer(text: str, answer_format: str) -> str | None:
    """The answer a sample votes for in cons@k, normalised so equal numbers vote together
    (``1,000`` == ``1000.0``); ``answer_format="choice"`` votes on option letters."""
    if answer_format == "choice":
        return extract_choice(text)
    answer, _ = extract_answer(text, answer_format)  # type: ignore[arg-type]
    if answer is None:
        return None
    number = parse_number(answer)
    return str(number) if number is not None else " ".join(answer.split())
