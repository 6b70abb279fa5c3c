"""Tool calls in an assistant reply: hermes JSON (``<tool_call>{"name":..., "arguments":{...}}</tool_call>``)
and qwen3_coder XML (``<tool_call><function=f><parameter=x>v</parameter></function></tool_call>``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"^\s*<function=([^>\s]+)>(.*)</function>\s*$", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ParsedReply:
    """The calls found, the text outside them, and a message for the first malformed call (None if all parsed)."""

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    error: str | None = None


def _hermes(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        raise ValueError(f"tool call is not valid JSON ({err.msg} at char {err.pos})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError('tool call needs {"name": "<tool>", "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise ValueError(f"tool call '{obj['name']}': arguments are a string that is not JSON") from None
    if not isinstance(args, dict):
        raise ValueError(f"tool call '{obj['name']}': arguments must be a JSON object")
    return ToolCall(obj["name"], args)


def _xml_value(raw: str):
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return value
    return parsed if not isinstance(parsed, str) else value


def _qwen3_coder(body: str) -> ToolCall:
    match = _FUNCTION.match(body)
    if not match:
        raise ValueError("tool call needs <function=NAME>...</function> inside <tool_call>")
    name, inner = match.groups()
    args = {key: _xml_value(raw) for key, raw in _PARAM.findall(inner)}
    leftover = _PARAM.sub("", inner).strip()
    if leftover:
        raise ValueError(f"tool call '{name}': text outside <parameter=...></parameter>: {leftover[:60]!r}")
    return ToolCall(name, args)


PARSERS = {"hermes": _hermes, "qwen3_coder": _qwen3_coder}
"""Tool-call formats by name."""


def parse_tool_calls(text: str, fmt: str = "hermes") -> ParsedReply:
    """Every ``<tool_call>`` block of ``text`` in ``fmt``; a malformed or unclosed block sets ``error``."""
    if fmt not in PARSERS:
        raise ValueError(f"tool call format '{fmt}' unknown; known: {', '.join(PARSERS)}")
    calls, error = [], None
    for body in _BLOCK.findall(text):
        try:
            calls.append(PARSERS[fmt](body.strip()))
        except ValueError as err:
            error = error or str(err)
    content = _BLOCK.sub("", text)
    if "<tool_call>" in content:
        error = error or "a <tool_call> is not closed with </tool_call>"
        content = content[: content.index("<tool_call>")]
    return ParsedReply(calls, content.strip(), error)
