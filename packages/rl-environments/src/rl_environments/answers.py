"""Pulling final answers out of model text: ``\\boxed{...}``, the last number, numeric comparison."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

AnswerFormat = Literal["boxed", "last_number", "either"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def extract_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if absent
    or empty (``\\boxed{} 42`` holds no answer: small models copy the bare macro from the instruction).

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    """
    best = None
    for macro in ("\\boxed", "\\fbox"):
        start = text.rfind(macro + "{")
        if start > (best[0] if best else -1):
            content = _balanced(text, start + len(macro))
            if content is not None:
                best = (start, content)
    return None if best is None or not best[1].strip() else best[1].strip()


def count_boxed(text: str) -> int:
    """How many ``\\boxed{`` / ``\\fbox{`` macros ``text`` holds."""
    return text.count("\\boxed{") + text.count("\\fbox{")


def boxed_repeats_result(text: str) -> bool:
    """True when ``text`` holds exactly one ``\\boxed{}`` with a number that equals the last number written
    before the box: the work is shown first and the box restates its result
    (``6 + 34 = 40, so \\boxed{40}``), as opposed to computing inside the box (``6 + 34 = \\boxed{40}``)."""
    if count_boxed(text) != 1:
        return False
    value = parse_number(extract_boxed(text))
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    before = last_number(text[:start])
    return value is not None and before is not None and parse_number(before) == value


def _balanced(text: str, open_index: int) -> str | None:
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
    return None


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (``-12``, ``3.5``, ``1,000``, ``1/2``), or None."""
    matches = _NUMBER.findall(text)
    return matches[-1] if matches else None


def parse_number(text: str | None) -> Fraction | None:
    """An exact number from a short answer string: ``42``, ``-3``, ``1,000``, ``0.5``, ``1/2``,
    ``\\frac{1}{2}``, ``$7$``, ``x = 7``, ``12 + 30 = 42`` (the value after the last ``=``). None when
    it is not a single plain number."""
    if text is None:
        return None
    s = text.strip().strip("$").strip()
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
    s = s.rsplit("=", 1)[-1].strip().strip("$").strip()  # "x = 7", "12 + 30 = 42": the final value
    s = s.replace("\\!", "").replace("{,}", "").replace(",", "").replace(" ", "").rstrip(".")
    frac = re.fullmatch(r"(-?)\\d?frac\{(-?\d+)\}\{(-?\d+)\}", s)
    try:
        if frac:
            sign = -1 if frac.group(1) else 1
            return sign * Fraction(int(frac.group(2)), int(frac.group(3)))
        if re.fullmatch(r"-?\d+/\d+|-?\d+(\.\d+)?|-?\.\d+", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def extract_answer(text: str, answer_format: AnswerFormat = "boxed") -> tuple[str | None, bool]:
    """``(answer, boxed)``: the final answer by ``answer_format`` and whether a ``\\boxed{}`` held it."""
    boxed = extract_boxed(text)
    if boxed is not None and answer_format in ("boxed", "either"):
        return boxed, True
    if answer_format in ("last_number", "either"):
        return last_number(text), False
    return None, False


def numbers_equal(answer: str | None, gold: object) -> bool:
    """Exact numeric equality (``0.5 == 1/2 == \\frac{1}{2}``); False when either side is not a number."""
    got = parse_number(answer)
    want = gold if isinstance(gold, Fraction) else parse_number(str(gold))
    return got is not None and want is not None and got == want


def last_assistant_text(messages: list[dict[str, str]]) -> str:
    """Content of the latest assistant message ('' if there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""
