"""SkyRL / veRL rows as users already have them: ``data_source``, ``prompt`` (chat messages), ``env_class``
(SkyRL) or ``ability`` (veRL), ``reward_spec`` (SkyRL) or ``reward_model`` (veRL) ``{method|style,
ground_truth}``, ``extra_info {split, index, ...}``, and optionally ``env_extras``.

The ground truth becomes the env's ``answer``; ``extra_info`` is kept on the item; ``data_source`` goes to
the ledger. Env names users already use (``gsm8k``, ``math``, ...) map to the built-in envs.
"""

from __future__ import annotations

import json

MARKERS = ("reward_spec", "reward_model", "data_source", "extra_info")
"""Any of these columns marks a row as SkyRL/veRL."""
USED = ("data_source", "prompt", "env_class", "ability", "reward_spec", "reward_model", "extra_info", "env_extras",
        "instance_id", "split")
"""Columns the loader reads from such a row; others are named once in the log."""
ENV_ALIASES = {"gsm8k": "math", "math": "math", "aime": "math", "openai/gsm8k": "math", "lighteval/MATH": "math",
               "DigitalLearningGmbH/MATH-lighteval": "math"}
"""SkyRL ``env_class`` names, veRL ``ability`` values and veRL ``data_source`` names → built-in envs."""


def is_community_row(row: dict) -> bool:
    return any(key in row for key in MARKERS)


def _dict(value, column: str, fail) -> dict:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise fail(column, "is a string that is not JSON") from None
    if not isinstance(value, dict):
        raise fail(column, f"must be a dict, got {type(value).__name__}")
    return value


def env_class(row: dict, known: list[str], fail) -> str:
    """The registered env for the row: its ``env_class`` (or veRL's ``ability`` / ``data_source``), via the aliases."""
    for column in ("env_class", "ability", "data_source"):
        name = row.get(column)
        if not name:
            continue
        if name in known:
            return name
        if name in ENV_ALIASES:
            return ENV_ALIASES[name]
        if column == "env_class":
            break
    name = row.get("env_class") or row.get("ability") or row.get("data_source")
    aliases = ", ".join(sorted(set(ENV_ALIASES) - set(known), key=str.lower))
    raise fail("env_class", f"'{name}' is neither a registered env nor a known alias; registered: {', '.join(known)}; "
                            f"aliases: {aliases}")


def fields(row: dict, known: list[str], fail) -> dict:
    """The project's fields of one SkyRL/veRL row: env_class, env_extras, split, index, data_source, extra_info."""
    extra_info = _dict(row.get("extra_info"), "extra_info", fail)
    extras = dict(_dict(row.get("env_extras"), "env_extras", fail))
    spec_column = "reward_spec" if row.get("reward_spec") is not None else "reward_model"
    spec = _dict(row.get(spec_column), spec_column, fail)
    if spec.get("ground_truth") is not None:
        truth = spec["ground_truth"]
        extras.setdefault("answer", truth if isinstance(truth, str) else json.dumps(truth))
    split = extra_info.get("split", row.get("split")) or "train"
    if not isinstance(split, str):
        raise fail("extra_info.split", f"must be a string, got {type(split).__name__}")
    return {"env_class": env_class(row, known, fail), "env_extras": extras, "split": split,
            "index": extra_info.get("index"), "data_source": row.get("data_source"), "extra_info": extra_info}
