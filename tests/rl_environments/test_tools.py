"""Tool-call parsing and the multi-turn tools environment on real strings (the python tool runs in the sandbox)."""

from __future__ import annotations

from rl_environments import ToolsEnvironment, parse_tool_calls, tools_split
from rl_environments.tools import format_tool_results


def test_parse_tool_calls():
    text = ('first <tool_call>{"name": "calculator", "arguments": {"expression": "2 * 21"}}</tool_call> then '
            '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
            "<tool_call>{not json}</tool_call><tool_call>[1, 2]</tool_call>"
            '<tool_call>{"name": "calculator", "arguments": "2+2"}</tool_call>')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("calculator", {"expression": "2 * 21"}),
                                                          ("python", {"code": "print(1)"})]
    assert "not valid JSON" in calls[2].error
    assert "must be an object" in calls[3].error
    assert "'arguments' must be an object" in calls[4].error
    assert parse_tool_calls("no calls here") == []
    assert format_tool_results(["1", "2"]) == "<tool_result>1</tool_result>\n<tool_result>2</tool_result>"


def test_tool_episode_calculator_then_answer():
    env = ToolsEnvironment()
    meta = {"answer": "389868"}
    messages = [{"role": "user", "content": "What is 613 * 636?"},
                {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": '
                                                 '{"expression": "613 * 636"}}</tool_call>'}]
    first = env.step(messages, meta, None)
    assert not first.done and first.observation_role == "tool"
    assert first.observation == "<tool_result>389868</tool_result>"
    assert first.metrics == {"tool_calls": 1.0, "tool_errors": 0.0}
    messages += [{"role": "tool", "content": first.observation},
                 {"role": "assistant", "content": r"The answer is \boxed{389868}."}]
    final = env.step(messages, meta, first.state)
    assert final.done and final.reward == 1.0 and final.reward_components == {"correct": 1.0, "format": 1.0}


def test_python_tool_runs_in_the_sandbox_and_errors_are_reported():
    env = ToolsEnvironment()
    text = ('<tool_call>{"name": "python", "arguments": {"code": "import os\\nprint(6 * 7, len(os.environ) < 10)"}}'
            '</tool_call><tool_call>{"name": "python", "arguments": {"code": "1/0"}}</tool_call>'
            '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>')
    result = env.step([{"role": "assistant", "content": text}], {"answer": "42"}, None)
    results = result.observation.split("\n")
    assert results[0] == "<tool_result>42 True</tool_result>"
    assert results[1] == "<tool_result>error: ZeroDivisionError: division by zero</tool_result>"
    assert "unknown tool 'search'" in results[2]
    assert results[3].startswith("<tool_result>error: not allowed")
    assert result.metrics == {"tool_calls": 4.0, "tool_errors": 3.0}


def test_wrong_answer_no_call_and_tool_turn_cap():
    env = ToolsEnvironment(max_tool_turns=2)
    meta = {"answer": "7"}
    assert env.step([{"role": "assistant", "content": r"\boxed{8}"}], meta, None).reward_components == {
        "correct": 0.0, "format": 1.0}
    plain = env.step([{"role": "assistant", "content": "I do not know"}], meta, None)
    assert plain.done and plain.reward == 0.0 and plain.reward_components["format"] == 0.0
    call = [{"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}'
                                             "</tool_call>"}]
    first = env.step(call, meta, None)
    second = env.step(call, meta, first.state)
    assert not first.done and second.done and second.reward == 0.0


def test_tools_dataset_has_the_tool_instructions():
    samples = tools_split(size=3)
    assert all(s.messages[0]["role"] == "system" and "<tool_call>" in s.messages[0]["content"] for s in samples)
    assert all(s.env == "tools" and s.metadata["answer"].isdigit() for s in samples)
