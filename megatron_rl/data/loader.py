"""Load prompt files (parquet or JSONL, the project's rows or SkyRL/veRL's) into validated ``PromptItem`` lists."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from megatron_rl.contracts import PromptItem
from megatron_rl.data.io import read_records
from megatron_rl.data.rows import Row, validate_row

log = logging.getLogger("megatron_rl")


def _paths(paths: str | Path | list) -> list[Path]:
    return [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]


def id_prefixes(paths: list[Path]) -> list[str]:
    """Each file's name in default instance ids: its stem, or where stems repeat (``gsm8k/train.parquet``,
    ``math/train.parquet``) its path below the files' common folder without the suffix, so that default
    ids never collide across files."""
    stems = [p.stem for p in paths]
    if len(set(stems)) == len(stems):
        return stems
    resolved = [p.resolve() for p in paths]
    common = Path(os.path.commonpath([p.parent for p in resolved]))
    names = [p.relative_to(common).with_suffix("").as_posix() for p in resolved]
    return names if len(set(names)) == len(names) else [p.relative_to(common).as_posix() for p in resolved]


def load_rows(paths: str | Path | list) -> list[Row]:
    """Every row of ``paths``, validated, with its split. Instance ids are unique across the files; the
    columns no row's format reads, and the ``extra_info`` keys kept, are named once per file in the log.

    Raises ValueError naming the file, row and column of a bad row, or an instance id used twice.
    """
    from megatron_rl.envs import env_names

    known = env_names()
    files = _paths(paths)
    rows: list[Row] = []
    seen: dict[str, str] = {}
    for path, prefix in zip(files, id_prefixes(files)):
        unused: set[str] = set()
        info: set[str] = set()
        for index, record in enumerate(read_records(path)):
            row = validate_row(record, str(path), index, known, prefix)
            if row.item.instance_id in seen:
                raise ValueError(f"{path} row {index}, column 'instance_id': '{row.item.instance_id}' already used "
                                 f"in {seen[row.item.instance_id]}; give the rows an instance_id column")
            seen[row.item.instance_id] = f"{path} row {index}"
            unused.update(row.unused)
            info.update(row.item.extra_info)
            rows.append(row)
        if unused:
            log.info("data: %s: columns not used: %s", path, ", ".join(sorted(unused)))
        if info:
            log.info("data: %s: extra_info kept on each item: %s", path, ", ".join(sorted(info)))
    return rows


def load_prompts(paths: str | Path | list, split: str | None = None) -> list[PromptItem]:
    """Every row of ``paths`` (validated) whose split is ``split`` (all rows if None)."""
    items = [r.item for r in load_rows(paths) if split is None or r.split == split]
    if split is not None and not items:
        raise ValueError(f"{paths}: no rows with split '{split}'")
    return items
