"""Small generated SQLite databases, kept as a JSON-able spec in ``env_extras["db"]`` and written on demand."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

FIRST = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Iris", "Jamal", "Kira", "Liam", "Mona",
         "Nico", "Olga", "Pavel", "Quinn", "Rosa", "Sami", "Tara"]
CITIES = ["Berlin", "Lagos", "Lima", "Osaka", "Oslo", "Pune"]
DEPARTMENTS = ["Sales", "Research", "Support", "Finance", "Legal"]
CATEGORIES = ["books", "games", "tools", "garden", "music"]
COUNTRIES = ["Brazil", "Canada", "India", "Japan", "Kenya"]


def _table(name: str, columns: list[tuple[str, str]], rows: list[list]) -> dict:
    return {"name": name, "columns": [list(c) for c in columns], "rows": rows}


def _company(rng: random.Random) -> list[dict]:
    depts = rng.sample(DEPARTMENTS, rng.randint(3, len(DEPARTMENTS)))
    departments = [[i + 1, d, rng.choice(CITIES)] for i, d in enumerate(depts)]
    employees = [[i + 1, f"{rng.choice(FIRST)} {chr(65 + i % 26)}.", rng.randint(1, len(depts)),
                  rng.randrange(30_000, 120_000, 500), rng.randint(2010, 2024)] for i in range(rng.randint(8, 16))]
    projects = [[i + 1, f"Project {chr(65 + i)}", rng.randint(1, len(depts)), rng.randrange(10_000, 200_000, 1000)]
                for i in range(rng.randint(4, 8))]
    return [
        _table("departments", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("city", "TEXT")], departments),
        _table("employees", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("department_id", "INTEGER"),
                             ("salary", "INTEGER"), ("hire_year", "INTEGER")], employees),
        _table("projects", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("department_id", "INTEGER"),
                            ("budget", "INTEGER")], projects),
    ]


def _shop(rng: random.Random) -> list[dict]:
    customers = [[i + 1, f"{rng.choice(FIRST)} {chr(65 + i % 26)}.", rng.choice(COUNTRIES)]
                 for i in range(rng.randint(5, 10))]
    products = [[i + 1, f"{rng.choice(CATEGORIES)[:-1].title()} {i + 1}", rng.choice(CATEGORIES),
                 round(rng.uniform(2, 80), 2)] for i in range(rng.randint(5, 10))]
    orders = [[i + 1, rng.randint(1, len(customers)), rng.randint(1, len(products)), rng.randint(1, 5),
               rng.randint(2019, 2024)] for i in range(rng.randint(8, 20))]
    return [
        _table("customers", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("country", "TEXT")], customers),
        _table("products", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("category", "TEXT"),
                            ("price", "REAL")], products),
        _table("orders", [("id", "INTEGER PRIMARY KEY"), ("customer_id", "INTEGER"), ("product_id", "INTEGER"),
                          ("quantity", "INTEGER"), ("order_year", "INTEGER")], orders),
    ]


DOMAINS = {"company": _company, "shop": _shop}


def make_database(rng: random.Random, domain: str) -> dict:
    """A database spec: ``{"domain": ..., "tables": [{"name", "columns": [[name, type]], "rows": [[...]]}]}``."""
    return {"domain": domain, "tables": DOMAINS[domain](rng)}


def schema_sql(spec: dict) -> str:
    """The CREATE TABLE statements of ``spec`` (what the model is shown)."""
    return "\n".join(
        f"CREATE TABLE {t['name']} ({', '.join(f'{c} {ty}' for c, ty in t['columns'])});" for t in spec["tables"]
    )


def fill(conn: sqlite3.Connection, spec: dict) -> None:
    """Create ``spec``'s tables in ``conn`` and insert its rows."""
    conn.executescript(schema_sql(spec))
    for t in spec["tables"]:
        marks = ", ".join("?" * len(t["columns"]))
        conn.executemany(f"INSERT INTO {t['name']} VALUES ({marks})", t["rows"])
    conn.commit()


def write_database(spec: dict, path: str | Path) -> None:
    """Create the SQLite file ``path`` holding ``spec``'s tables and rows."""
    conn = sqlite3.connect(path)
    try:
        fill(conn, spec)
    finally:
        conn.close()
