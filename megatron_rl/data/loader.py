"""Load prompt files (parquet or JSONL) into validated ``PromptItem`` lists."""

from __future__ import annotations

from pathlib import Path

from megatron_rl.contracts import PromptItem
from megatron_rl.data.io import read_records
from megatron_rl.data.rows import validate_row


def load_prompts(paths: str | Path | list, split: str | None = None) -> list[PromptItem]:
    """Every row of ``paths`` (validated) whose split is ``split`` (all rows if None).

    Raises ValueError naming the file, row and column of a bad row, or an instance id used twice.
    """
    from megatron_rl.envs import env_names

    known = env_names()
    items: list[PromptItem] = []
    seen: dict[str, str] = {}
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        for index, row in enumerate(read_records(path)):
            item, row_split = validate_row(row, str(path), index, known)
            if item.instance_id in seen:
                raise ValueError(f"{path} row {index}, column 'instance_id': '{item.instance_id}' already used "
                                 f"in {seen[item.instance_id]}")
            seen[item.instance_id] = f"{path} row {index}"
            if split is None or row_split == split:
                items.append(item)
    if split is not None and not items:
        raise ValueError(f"{paths}: no rows with split '{split}'")
    return items
