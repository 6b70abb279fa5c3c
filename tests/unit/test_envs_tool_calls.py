"""Hermes JSON and qwen3_coder XML tool-call parsing, including malformed input."""

import pytest

from megatron_rl.envs import ToolCall, parse_tool_calls


def test_hermes_calls_and_content():
    text = ('Let me check.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>'
            '<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>')
    parsed = parse_tool_calls(text)
    assert parsed.calls == [ToolCall("run_sql", {"query": "SELECT 1"}), ToolCall("f", {"x": 2})]
    assert parsed.content == "Let me check." and parsed.error is None


@pytest.mark.parametrize("body, message", [
    ('{"name": "f", "arguments": {"x": 1}', "not valid JSON"),
    ('{"arguments": {}}', "needs"),
    ('{"name": "f", "arguments": [1]}', "must be a JSON object"),
    ('{"name": "f", "arguments": "not json"}', "not JSON"),
])
def test_hermes_malformed(body, message):
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.calls == [] and message in parsed.error


def test_unclosed_call_is_an_error_and_good_calls_survive():
    parsed = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b"')
    assert parsed.calls == [ToolCall("a", {})]
    assert "not closed" in parsed.error and parsed.content == "then"


def test_no_calls():
    parsed = parse_tool_calls("The answer is 4.")
    assert parsed.calls == [] and parsed.error is None and parsed.content == "The answer is 4."


def test_qwen3_coder_calls_with_typed_values():
    text = ("<tool_call>\n<function=submit_schedule>\n<parameter=schedule>\n[\"charge\", \"sell\"]\n</parameter>\n"
            "<parameter=note>\nhello\nworld\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>")
    parsed = parse_tool_calls(text, "qwen3_coder")
    assert parsed.error is None
    assert parsed.calls == [ToolCall("submit_schedule", {"schedule": ["charge", "sell"], "note": "hello\nworld", "n": 3})]


@pytest.mark.parametrize("body, message", [
    ("<parameter=x>1</parameter>", "needs <function=NAME>"),
    ("<function=f><parameter=x>1</parameter>", "needs <function=NAME>"),
    ("<function=f>stray<parameter=x>1</parameter></function>", "text outside"),
])
def test_qwen3_coder_malformed(body, message):
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>", "qwen3_coder")
    assert parsed.calls == [] and message in parsed.error


def test_unknown_format():
    with pytest.raises(ValueError, match="hermes, qwen3_coder"):
        parse_tool_calls("", "mistral")
