"""``text2sql`` dataset rows: a generated database, a question and its gold query per row."""

from __future__ import annotations

import random
import sqlite3

from megatron_rl.envs.text2sql.databases import DOMAINS, fill, make_database, schema_sql
from megatron_rl.envs.text2sql.questions import make_question

INSTRUCTION = ("You answer questions about a SQLite database with one SELECT query. Submit it by calling run_sql "
               "(or in a ```sql block). If it fails you see the error and may fix it.")


def _gold_rows(spec: dict, sql: str) -> list:
    conn = sqlite3.connect(":memory:")
    try:
        fill(conn, spec)
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def make_task(rng: random.Random) -> tuple[dict, str, str]:
    """(db spec, question, gold sql) whose gold result is non-empty and not all NULL."""
    while True:
        spec = make_database(rng, rng.choice(sorted(DOMAINS)))
        question, sql = make_question(spec, rng)
        rows = _gold_rows(spec, sql)
        if rows and any(v is not None for row in rows for v in row):
            return spec, question, sql


def generate_rows(n: int, seed: int, split: str = "train") -> list[dict]:
    """``n`` rows; ``env_extras`` holds the database spec (``db``), ``question`` and ``gold_sql``."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        spec, question, sql = make_task(rng)
        user = f"Database schema:\n{schema_sql(spec)}\n\nQuestion: {question}"
        rows.append({"prompt": [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": user}],
                     "env_class": "text2sql", "env_extras": {"db": spec, "question": question, "gold_sql": sql},
                     "split": split, "instance_id": f"text2sql-{seed}-{i}"})
    return rows
