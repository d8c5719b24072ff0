"""The code environment: programs graded by test cases in the sandbox."""

from __future__ import annotations

from rl_environments import CodeEnvironment
from rl_environments.code_env import extract_code

TESTS = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"}, {"input": "0 0", "output": "0"}]


def said(text):
    return [{"role": "user", "content": "Add two numbers from stdin."}, {"role": "assistant", "content": text}]


def test_extract_code_takes_the_last_block():
    text = "draft:\n```python\nprint(1)\n```\nfinal:\n```python\nprint(2)\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("no code") is None


def test_correct_partial_and_broken_programs():
    env = CodeEnvironment(wall_time_s=10)
    good = env.step(said("```python\na, b = map(int, input().split())\nprint(a + b)\n```"), {"tests": TESTS}, None)
    assert good.reward_components == {"pass_rate": 1.0, "all_passed": 1.0, "format": 1.0} and good.reward == 1.0
    partial = env.step(said("```python\na, b = map(int, input().split())\nprint(abs(a) + abs(b))\n```"),
                       {"tests": TESTS}, None)
    assert partial.reward_components["pass_rate"] == 2 / 3 and partial.reward_components["all_passed"] == 0.0
    broken = env.step(said("```python\nraise SystemExit(3)\n```"), {"tests": TESTS}, None)
    assert broken.reward == 0.0 and broken.reward_components["format"] == 1.0
    no_code = env.step(said("a + b"), {"tests": TESTS}, None)
    assert no_code.reward_components == {"pass_rate": 0.0, "all_passed": 0.0, "format": 0.0}


def test_hanging_program_scores_zero_and_counts_a_timeout():
    env = CodeEnvironment(reward="all_passed", cpu_time_s=1, wall_time_s=1.5)
    result = env.step(said("```python\nimport time\ntime.sleep(30)\n```"), {"tests": TESTS[:1]}, None)
    assert result.reward == 0.0 and result.metrics["code_timeouts"] == 1.0
