"""Validate prompt rows, in the project's format or SkyRL/veRL's (``community.py``), into ``PromptItem``.

Project rows: ``prompt`` (chat messages), ``env_class``, ``env_extras`` (dict), ``split``, optional
``instance_id``. Either format is checked against what its env needs (``Env.required_extras``), so a bad
row fails at load time, naming its file, row and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial

from megatron_rl.contracts import PromptItem
from megatron_rl.data import community

COLUMNS = ("prompt", "env_class", "env_extras", "split")
"""Required columns of a project row; ``instance_id`` is optional (default ``<file>-<row>``)."""


@dataclass
class Row:
    """A validated row: the item, its split, and the columns the loader did not read."""

    item: PromptItem
    split: str
    unused: list[str]


def _fail(source: str, index: int, column: str, problem: str) -> ValueError:
    field = "column" if "." not in column else "field"
    return ValueError(f"{source} row {index}, {field} '{column}': {problem}")


def _messages(value, fail) -> list[dict]:
    if hasattr(value, "tolist"):  # numpy arrays from pandas-written parquet
        value = value.tolist()
    if not isinstance(value, list) or not value:
        raise fail("prompt", "must be a non-empty list of chat messages")
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise fail("prompt", f"message {m!r} needs string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _project_fields(row: dict, known: list[str], fail) -> dict:
    for column in COLUMNS:
        if column not in row or row[column] is None:
            raise fail(column, f"missing (columns present: {sorted(row)})")
    if row["env_class"] not in known:
        raise fail("env_class", f"'{row['env_class']}' is not registered; known: {', '.join(known)}")
    if not isinstance(row["split"], str):
        raise fail("split", "must be a string")
    extras = row["env_extras"]
    if isinstance(extras, str):
        try:
            extras = json.loads(extras)
        except json.JSONDecodeError:
            raise fail("env_extras", "is a string that is not JSON") from None
    if not isinstance(extras, dict):
        raise fail("env_extras", f"must be a dict, got {type(extras).__name__}")
    return {"env_class": row["env_class"], "env_extras": extras, "split": row["split"], "index": None,
            "data_source": None, "extra_info": {}}


def _check_extras(env_class: str, extras: dict, community_row: bool, fail) -> None:
    from megatron_rl.envs import get_env_class

    for key in get_env_class(env_class).required_extras:
        if extras.get(key) is None:
            hint = " (from reward_spec.ground_truth or reward_model.ground_truth)" if key == "answer" and community_row else ""
            raise fail(f"env_extras.{key}", f"missing; env_class '{env_class}' needs it{hint}")


def validate_row(row: dict, source: str, index: int, known_envs: list[str], id_prefix: str | None = None) -> Row:
    """The validated row; ValueError naming the file, row and column (or field) otherwise.

    ``id_prefix`` names the file in default instance ids (``<prefix>-<index>``); the file stem if None.
    """
    from pathlib import Path

    fail = partial(_fail, source, index)
    community_row = community.is_community_row(row)
    fields = community.fields(row, known_envs, fail) if community_row else _project_fields(row, known_envs, fail)
    _check_extras(fields["env_class"], fields["env_extras"], community_row, fail)
    key = fields["index"] if fields["index"] is not None else index
    instance_id = row.get("instance_id") or f"{id_prefix or Path(source).stem}-{key}"
    item = PromptItem(str(instance_id), _messages(row.get("prompt"), fail), fields["env_class"], fields["env_extras"],
                      data_source=fields["data_source"], extra_info=fields["extra_info"])
    used = community.USED if community_row else (*COLUMNS, "instance_id")
    return Row(item, fields["split"], sorted(set(row) - set(used)))
