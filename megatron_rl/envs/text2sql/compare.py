"""Result-set equality: order-insensitive (as multisets) unless the gold query orders its rows."""

from __future__ import annotations

import re
from collections import Counter

_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def _normal(value):
    return round(value, 6) if isinstance(value, float) else value


def _rows(rows: list[tuple]) -> list[tuple]:
    return [tuple(_normal(v) for v in row) for row in rows]


def is_ordered(gold_sql: str) -> bool:
    """Whether row order counts: the gold query has an ORDER BY."""
    return bool(_ORDER_BY.search(gold_sql))


def results_match(predicted: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    """Same rows (floats to 6 decimals), in the same order when ``ordered``; column names are ignored."""
    p, g = _rows(predicted), _rows(gold)
    return p == g if ordered else Counter(p) == Counter(g)
