"""Read and write row files: parquet or JSONL, chosen by suffix. ``env_extras`` is stored as JSON text in parquet
(its keys differ between envs), as an object in JSONL; the loader accepts either."""

from __future__ import annotations

import json
from pathlib import Path

SUFFIXES = (".parquet", ".jsonl")


def _suffix(path: Path) -> str:
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{path}: unsupported file type '{path.suffix}'; use one of {', '.join(SUFFIXES)}")
    return path.suffix


def read_records(path: str | Path) -> list[dict]:
    """Every row of a parquet or JSONL file as a dict."""
    path = Path(path)
    if _suffix(path) and not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    records = []
    with path.open() as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path} line {i + 1}: not valid JSON ({err.msg})") from None
    return records


def write_records(rows: list[dict], path: str | Path) -> Path:
    """Write ``rows`` to ``path`` (parent folders created); returns the path."""
    path = Path(path)
    _suffix(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        encoded = [{**r, "env_extras": json.dumps(r["env_extras"])} if "env_extras" in r else r for r in rows]
        pq.write_table(pa.Table.from_pylist(encoded), path)
    else:
        with path.open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return path
