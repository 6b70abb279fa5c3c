"""Run one SQL statement read-only, with a time limit and a row limit; errors come back as text."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    error: str | None = None
    truncated: bool = False
    """More than the row limit came back; ``rows`` holds the first ``max_rows``."""


def _authorize(action: int, *_args) -> int:
    """Reads only: no writes, schema changes, ATTACH or PRAGMA even if the file were writable."""
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def _connect(path: str | Path) -> sqlite3.Connection:
    uri = f"file:{quote(str(Path(path).resolve()))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(_authorize)
    return conn


def run_query(path: str | Path, sql: str, time_limit_s: float, max_rows: int) -> QueryResult:
    """Execute ``sql`` against the database file ``path`` read-only; never raises for a bad query."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"text2sql database {path} does not exist")
    conn = _connect(path)
    deadline = time.monotonic() + time_limit_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
        columns = [d[0] for d in cursor.description or []]
    except (sqlite3.Error, sqlite3.Warning, ValueError) as err:
        message = str(err)
        if "interrupted" in message:
            message = f"query stopped: it ran longer than the time limit of {time_limit_s:g}s"
        return QueryResult([], [], error=f"{type(err).__name__}: {message}")
    finally:
        conn.close()
    return QueryResult(columns, [tuple(r) for r in rows[:max_rows]], truncated=len(rows) > max_rows)
