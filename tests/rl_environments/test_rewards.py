"""Reward functions of the single-turn environments on real strings."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rl_environments import ArithmeticEnvironment, CountdownEnvironment, MathEnvironment
from rl_environments.answers import extract_boxed, last_number, numbers_equal, parse_number
from rl_environments.calculator import CalculatorError, evaluate
from rl_environments.countdown import check_expression


def said(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "question"}, {"role": "assistant", "content": text}]


def test_extract_boxed_takes_the_last_balanced_box():
    assert extract_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{ {a}+{b} }") == "{a}+{b}"
    assert extract_boxed(r"unclosed \boxed{12") is None
    assert extract_boxed("no box at all 12") is None
    assert extract_boxed(r"\fbox{7}") == "7"


def test_last_number_and_parse_number():
    assert last_number("3 apples and -1,250.5 pears") == "-1,250.5"
    assert last_number("nothing") is None
    assert parse_number(r"\frac{1}{2}") == Fraction(1, 2)
    assert parse_number("0.5") == parse_number("1/2") == Fraction(1, 2)
    assert parse_number("x = 7") == 7
    assert extract_boxed(r"95 + 46 = \boxed{} 141") is None and extract_boxed(r"\boxed{ }") is None
    assert parse_number("12 + 30 = 42") == 42 and parse_number("$a = b = -3$") == -3
    assert parse_number("42 = 12 + 30") is None and parse_number("12 + 30") is None
    assert parse_number("$1,000$") == 1000
    assert parse_number("seven") is None
    assert numbers_equal("0.50", "1/2") and not numbers_equal("0.5", "2")


@pytest.mark.parametrize(
    ("text", "answer_format", "correct", "fmt"),
    [
        (r"12 + 30 = 42, so \boxed{42}", "boxed", 1.0, 1.0),
        (r"\boxed{41}", "boxed", 0.0, 1.0),
        ("the answer is 42", "boxed", 0.0, 0.0),
        ("the answer is 42", "last_number", 1.0, 0.0),
        ("the answer is 42", "either", 1.0, 0.0),
        (r"\boxed{42.0}", "either", 1.0, 1.0),
        (r"I think 42 but \boxed{40}", "either", 0.0, 1.0),  # a box, when present, is the answer
        (r"\boxed{forty-two}", "boxed", 0.0, 0.0),  # the format is a boxed NUMBER
        (r"\boxed{ANSWER}", "either", 0.0, 0.0),  # the instruction's placeholder, copied
        (r"12 + 30 = \boxed{} 42", "either", 1.0, 0.0),  # an empty box holds no answer
        (r"12 + \boxed{30} = \boxed{42}", "either", 1.0, 0.0),  # one box, not several
        (r"\boxed{12 + 30 = 42}", "boxed", 1.0, 1.0),
        ("", "either", 0.0, 0.0),
    ],
)
def test_arithmetic_reward(text, answer_format, correct, fmt):
    env = ArithmeticEnvironment(answer_format=answer_format)
    result = env.step(said(text), {"answer": "42"}, None)
    assert result.done
    assert result.reward_components == {"correct": correct, "format": fmt}
    assert result.reward == correct


def test_arithmetic_format_weight_and_bad_settings():
    result = ArithmeticEnvironment(format_weight=0.1).step(said(r"\boxed{3}"), {"answer": "4"}, None)
    assert result.reward == pytest.approx(0.1)
    with pytest.raises(ValueError, match="answer_format"):
        ArithmeticEnvironment(answer_format="first_number")


@pytest.mark.parametrize(
    ("text", "additive", "gated"),
    [(r"2 + 2 = \boxed{4}", 3.0, 3.0),      # boxed and correct: full reward either way
     (r"2 + 2 = \boxed{5}", 2.0, 0.0),      # boxed but wrong: the gated bonus pays nothing
     ("2 + 2 = 4", 1.0, 1.0),               # correct by its last number, no box
     ("2 + 2 = 5", 0.0, 0.0)],
)
def test_arithmetic_format_bonus_gated_on_correctness(text, additive, gated):
    meta = {"answer": "4"}
    plain = ArithmeticEnvironment(answer_format="either", format_weight=2.0)
    strict = ArithmeticEnvironment(answer_format="either", format_weight=2.0, format_requires_correct=True)
    assert plain.step(said(text), meta, None).reward == additive
    assert strict.step(said(text), meta, None).reward == gated


@pytest.mark.parametrize(
    ("text", "one_box", "result_then_box"),
    [(r"2 + 2 = 4, so \boxed{4}", 1.0, 1.0),
     ("2 + 2 = 4\n\nThe final answer is \\boxed{4}.", 1.0, 1.0),
     (r"2 + 2 = \boxed{4}", 1.0, 0.0),           # computed inside the box: the work is not shown first
     (r"\boxed{4}", 1.0, 0.0),
     (r"2 + 2 = 4 \boxed{4} \boxed{4}", 0.0, 0.0),  # two boxes
     (r"2 + 2 = 5, so \boxed{4}", 1.0, 0.0)],     # the box does not restate the result
)
def test_arithmetic_format_rules(text, one_box, result_then_box):
    for rule, fmt in (("one_box", one_box), ("result_then_box", result_then_box)):
        env = ArithmeticEnvironment(answer_format="either", format_rule=rule)
        assert env.step(said(text), {"answer": "4"}, None).reward_components["format"] == fmt
    with pytest.raises(ValueError, match="format_rule"):
        ArithmeticEnvironment(format_rule="boxed_last")


@pytest.mark.parametrize(
    ("expression", "ok"),
    [("(25 - 5) * 4", True), ("4 * (25 - 5)", True), ("25 * 4 - 5", False), ("(25 - 5) * 4 * 1", False),
     ("(25 - 5) * 2 * 2", False), ("import os", False), ("", False), ("(25 - 5) * 4.0", False)],
)
def test_countdown_expression_rules(expression, ok):
    assert check_expression(expression, [4, 5, 25], 80) is ok


def test_countdown_environment():
    env = CountdownEnvironment()
    meta = {"numbers": [4, 5, 25], "target": 80}
    assert env.step(said(r"so \boxed{(25 - 5) * 4}"), meta, None).reward_components == {"correct": 1.0, "format": 1.0}
    assert env.step(said(r"\boxed{(25 - 5) * 4 = 80}"), meta, None).reward == 1.0
    assert env.step(said(r"\boxed{25 + 5 + 4}"), meta, None).reward_components == {"correct": 0.0, "format": 1.0}
    assert env.step(said("(25 - 5) * 4"), meta, None).reward_components == {"correct": 0.0, "format": 0.0}
    assert CountdownEnvironment(use_all_numbers=False).step(said(r"\boxed{(20 * 4)}"), {"numbers": [20, 4, 9],
                                                                                        "target": 80}, None).reward == 1.0


def test_calculator_is_safe_and_exact():
    assert evaluate("1/3 * 3") == 1
    assert evaluate("2 ^ 10") == 1024
    assert evaluate("sqrt(16) + abs(-2)") == 6
    for bad in ["__import__('os')", "open('x')", "(1).__class__", "9 ** 9 ** 9", "1 / 0", "x + 1", "[1, 2]"]:
        with pytest.raises(CalculatorError):
            evaluate(bad)


@pytest.fixture(scope="module")
def math_env():
    env = MathEnvironment(num_workers=1, timeout_s=60)
    yield env
    env.close()


@pytest.mark.parametrize(
    ("response", "gold", "correct", "integer"),
    [
        (r"so \boxed{\frac{1}{2}}", "0.5", 1.0, 0.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0, 0.0),
        (r"\boxed{1/2}", "1/2", 1.0, 0.0),
        (r"\boxed{\frac{2}{4}}", "1/2", 1.0, 0.0),
        (r"\boxed{\sqrt{2}/2}", r"\frac{1}{\sqrt{2}}", 1.0, 0.0),
        (r"\boxed{12}", "12", 1.0, 1.0),
        (r"\boxed{13}", "12", 0.0, 1.0),
        ("the answer is 12", "12", 0.0, 0.0),  # no box: not graded as correct
        (r"\boxed{x^{2", "4", 0.0, 0.0),  # unparsable (no closing brace: no box)
        (r"\boxed{???}", "4", 0.0, 0.0),
    ],
)
def test_math_environment_with_math_verify(math_env, response, gold, correct, integer):
    result = math_env.step(said(response), {"answer": gold}, None)
    assert result.reward_components["correct"] == correct
    assert result.reward_components["integer"] == integer
    assert result.reward_components["format"] == float(extract_boxed(response) is not None)
    assert result.metrics["math_verify_error"] == 0.0
    assert result.reward == correct


def test_math_environment_pickles_without_its_pool(math_env):
    import pickle

    clone = pickle.loads(pickle.dumps(math_env))
    assert clone._pool is None and clone.timeout_s == math_env.timeout_s
