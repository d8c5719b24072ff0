"""Code: run the model's Python program in the sandbox against test cases.

``metadata['tests']`` is a list of ``{"input": str, "output": str}`` cases: the program reads the
input on stdin and must print the expected output (compared after stripping trailing whitespace on
each line). Each case runs in its own fresh sandbox, so a program cannot tamper with a later case.
"""

from __future__ import annotations

import re

from rl_core.types import StepResult
from rl_environments.answers import last_assistant_text
from rl_environments.sandbox import SandboxLimits, run_python

_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The last fenced code block (```python ... ```), or None."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def outputs_match(got: str, expected: str) -> bool:
    norm = lambda s: "\n".join(line.rstrip() for line in s.strip().splitlines())  # noqa: E731
    return norm(got) == norm(expected)


class CodeEnvironment:
    """Single-turn grader. Components: ``pass_rate`` (fraction of cases passed), ``all_passed`` and
    ``format`` (a code block was found). Reward = ``pass_rate`` (or ``all_passed`` when
    ``reward="all_passed"``)."""

    def __init__(self, reward: str = "pass_rate", cpu_time_s: int = 5, wall_time_s: float = 10.0,
                 memory_mb: int = 1024, max_tests: int = 50):
        if reward not in ("pass_rate", "all_passed"):
            raise ValueError(f"reward must be 'pass_rate' or 'all_passed', got {reward!r}")
        self.reward = reward
        self.limits = SandboxLimits(cpu_time_s=cpu_time_s, wall_time_s=wall_time_s, memory_mb=memory_mb)
        self.max_tests = max_tests

    def step(self, messages, metadata, state) -> StepResult:
        tests = metadata.get("tests")
        if not tests:
            raise KeyError("code environment needs metadata['tests'] = [{'input': ..., 'output': ...}, ...]")
        code = extract_code(last_assistant_text(messages))
        passed = timeouts = 0
        if code is not None:
            for case in tests[: self.max_tests]:
                result = run_python(code, stdin=str(case.get("input", "")), limits=self.limits)
                timeouts += result.timed_out
                passed += result.ok and outputs_match(result.stdout, str(case["output"]))
        total = min(len(tests), self.max_tests)
        components = {"pass_rate": passed / total, "all_passed": float(passed == total and code is not None),
                      "format": float(code is not None)}
        return StepResult(reward=components[self.reward], reward_components=components, done=True,
                          metrics={"code_timeouts": float(timeouts)})
