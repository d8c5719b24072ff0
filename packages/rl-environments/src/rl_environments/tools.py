"""Tools: a multi-turn environment where the model may call a calculator or a sandboxed Python tool
before giving its final answer.

Tag format (docs/environments.md):

* the model calls a tool with a JSON object inside tags, one or more per turn::

      <tool_call>{"name": "calculator", "arguments": {"expression": "123 * 45"}}</tool_call>
      <tool_call>{"name": "python", "arguments": {"code": "print(2 ** 10)"}}</tool_call>

* the environment answers with one message of role ``tool`` holding one result per call, in order::

      <tool_result>5535</tool_result>

* a final answer in ``\\boxed{}`` ends the episode and is graded against ``metadata['answer']``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rl_core.types import PromptSample, StepResult
from rl_environments.answers import extract_boxed, last_assistant_text, numbers_equal
from rl_environments.arithmetic import ArithmeticDatasetConfig, arithmetic_split
from rl_environments.calculator import CalculatorError, evaluate, format_number
from rl_environments.sandbox import SandboxLimits, run_python
from rl_environments.splits import Split

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_CALL_STOP = "</tool_call>"
TOOLS_SYSTEM_PROMPT = (
    "You can use tools. To call one, write <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call> and "
    "wait for the <tool_result>. Tools: calculator (arguments: expression, e.g. \"12 * (3 + 4)\"), python "
    "(arguments: code; whatever the code prints is returned). When you know the answer, write it in \\boxed{}."
)


@dataclass
class ToolCall:
    name: str | None
    arguments: dict[str, Any]
    error: str | None = None
    """Why the call could not be parsed (then ``name`` may be None)."""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` in ``text``, parsed; malformed ones carry an ``error``."""
    calls = []
    for body in _TOOL_CALL.findall(text):
        try:
            data = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append(ToolCall(None, {}, f"tool call is not valid JSON: {err.msg}"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(None, {}, 'tool call must be an object like {"name": ..., "arguments": {...}}'))
            continue
        arguments = data.get("arguments", {})
        if not isinstance(arguments, dict):
            calls.append(ToolCall(data["name"], {}, "tool call 'arguments' must be an object"))
            continue
        calls.append(ToolCall(data["name"], arguments))
    return calls


def format_tool_results(results: list[str]) -> str:
    return "\n".join(f"<tool_result>{r}</tool_result>" for r in results)


class ToolsEnvironment:
    """Multi-turn tool use graded on the final ``\\boxed{}`` answer (numeric equality with
    ``metadata['answer']``). Components: ``correct``, ``format`` (a final box was given).
    Metrics: ``tool_calls``, ``tool_errors``. An episode ends on a final answer, on a turn with neither
    a tool call nor an answer, or after ``max_tool_turns`` turns of tool calls (reward 0)."""

    def __init__(self, max_tool_turns: int = 4, python_timeout_s: float = 5.0, max_result_chars: int = 1000,
                 tools: tuple[str, ...] = ("calculator", "python")):
        unknown = set(tools) - {"calculator", "python"}
        if unknown:
            raise ValueError(f"unknown tools {sorted(unknown)}; available: calculator, python")
        self.max_tool_turns = max_tool_turns
        self.python_limits = SandboxLimits(cpu_time_s=max(1, int(python_timeout_s)), wall_time_s=python_timeout_s,
                                           max_output_bytes=max_result_chars)
        self.max_result_chars = max_result_chars
        self.tools = tuple(tools)

    def step(self, messages, metadata, state) -> StepResult:
        state = dict(state or {"tool_turns": 0})
        text = last_assistant_text(messages)
        boxed = extract_boxed(text)
        calls = parse_tool_calls(text)
        if boxed is not None or not calls:
            correct = float(boxed is not None and numbers_equal(boxed, metadata["answer"]))
            return StepResult(reward=correct, reward_components={"correct": correct, "format": float(boxed is not None)},
                              done=True, metrics={"tool_calls": 0.0, "tool_errors": 0.0}, state=state)
        state["tool_turns"] += 1
        results = [self.call(c) for c in calls]
        errors = sum(r.startswith("error:") for r in results)
        metrics = {"tool_calls": float(len(calls)), "tool_errors": float(errors)}
        if state["tool_turns"] >= self.max_tool_turns:
            return StepResult(reward=0.0, reward_components={"correct": 0.0, "format": 0.0}, done=True,
                              metrics=metrics, state=state)
        return StepResult(observation=format_tool_results(results), observation_role="tool", done=False,
                          reward=0.0, reward_components={"correct": 0.0, "format": 0.0}, metrics=metrics, state=state)

    def call(self, call: ToolCall) -> str:
        """The text result of one tool call (``error: ...`` when it failed)."""
        if call.error:
            return f"error: {call.error}"
        if call.name not in self.tools:
            return f"error: unknown tool {call.name!r}; available: {', '.join(self.tools)}"
        if call.name == "calculator":
            try:
                return format_number(evaluate(str(call.arguments.get("expression", ""))))
            except CalculatorError as err:
                return f"error: {err}"
        result = run_python(str(call.arguments.get("code", "")), limits=self.python_limits)
        if result.timed_out:
            return "error: the code ran out of time"
        if result.returncode != 0:
            tail = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
            return f"error: {tail[0][: self.max_result_chars]}"
        return result.stdout.strip()[: self.max_result_chars]


def tools_split(cfg: ArithmeticDatasetConfig | None = None, split: Split = "train",
                size: int | None = None) -> list[PromptSample]:
    """Arithmetic questions (default: 3-digit products) posed with the tool instructions."""
    cfg = cfg or ArithmeticDatasetConfig(digits=3, num_operands=2, operators=["*"])
    samples = arithmetic_split(cfg, split, size)
    for sample in samples:
        sample.messages = [{"role": "system", "content": TOOLS_SYSTEM_PROMPT},
                           *[m for m in sample.messages if m["role"] != "system"]]
        sample.env = "tools"
    return samples
