"""Which rows train and which evaluate: the user's eval files, else the eval split of the user's train files,
else rows held out from them. Never another task's generated data in place of the user's."""

from __future__ import annotations

import random
from dataclasses import dataclass

from megatron_rl.contracts import PromptItem
from megatron_rl.data.rows import Row

EVAL_SPLITS = ("test", "eval", "validation", "val")
"""Split names that mark a row for evaluation; such rows are never trained on."""


@dataclass
class Splits:
    train: list[PromptItem]
    eval: list[PromptItem]
    eval_source: str
    """Where evaluation rows come from: ``eval_files``, ``split`` (of the train files), ``holdout`` or ``none``."""


def _train_rows(rows: list[Row], where: str) -> list[PromptItem]:
    train = [r.item for r in rows if r.split not in EVAL_SPLITS]
    if not train:
        raise ValueError(f"{where}: every row has an evaluation split ({', '.join(EVAL_SPLITS)}); "
                         "give rows with another split (e.g. 'train') to train on")
    return train


def holdout_count(n_rows: int, eval_holdout: int) -> int:
    """Rows held out of ``n_rows``: ``eval_holdout``, at most a tenth of the rows, at least one (if any asked)."""
    if eval_holdout == 0 or n_rows < 2:
        return 0
    return max(1, min(eval_holdout, n_rows // 10))


def split_rows(train_rows: list[Row], eval_rows: list[Row] | None, eval_holdout: int, seed: int) -> Splits:
    """Training and evaluation items. ``eval_rows`` None means no eval files were given."""
    train = _train_rows(train_rows, "data.train_files")
    if eval_rows is not None:
        return Splits(train, [r.item for r in eval_rows], "eval_files")
    marked = [r.item for r in train_rows if r.split in EVAL_SPLITS]
    if marked:
        return Splits(train, marked, "split")
    count = holdout_count(len(train), eval_holdout)
    if count == 0:
        return Splits(train, [], "none")
    order = list(range(len(train)))
    random.Random(f"holdout:{seed}").shuffle(order)
    held = set(order[:count])
    return Splits([t for i, t in enumerate(train) if i not in held], [train[i] for i in sorted(held)], "holdout")
