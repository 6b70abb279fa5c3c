"""Validate prompt rows: ``prompt`` (chat messages), ``env_class``, ``env_extras`` (dict), ``split``, optional ``instance_id``."""

from __future__ import annotations

import json
from pathlib import Path

from megatron_rl.contracts import PromptItem

COLUMNS = ("prompt", "env_class", "env_extras", "split")
"""Required columns; ``instance_id`` is optional (default ``<file stem>-<row>``)."""


def _fail(source: str, index: int, column: str, problem: str) -> ValueError:
    return ValueError(f"{source} row {index}, column '{column}': {problem}")


def _messages(value, source: str, index: int) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise _fail(source, index, "prompt", "must be a non-empty list of chat messages")
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise _fail(source, index, "prompt", f"message {m!r} needs string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _extras(value, source: str, index: int) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _fail(source, index, "env_extras", "is a string that is not JSON") from None
    if not isinstance(value, dict):
        raise _fail(source, index, "env_extras", f"must be a dict, got {type(value).__name__}")
    return value


def validate_row(row: dict, source: str, index: int, known_envs: list[str]) -> tuple[PromptItem, str]:
    """(item, split) for one row; ValueError naming the file, row and column otherwise."""
    for column in COLUMNS:
        if column not in row or row[column] is None:
            raise _fail(source, index, column, f"missing (columns present: {sorted(row)})")
    if row["env_class"] not in known_envs:
        raise _fail(source, index, "env_class",
                    f"'{row['env_class']}' is not registered; known: {', '.join(known_envs)}")
    if not isinstance(row["split"], str):
        raise _fail(source, index, "split", "must be a string")
    instance_id = row.get("instance_id") or f"{Path(source).stem}-{index}"
    item = PromptItem(str(instance_id), _messages(row["prompt"], source, index), row["env_class"],
                      _extras(row["env_extras"], source, index))
    return item, row["split"]
