"""A run's folder: resolved config, ``metrics.jsonl`` (one object per step) and ``trajectories.jsonl``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from megatron_rl.contracts import Trajectory, to_record

METRIC_NAME = re.compile(r"^[a-z0-9_]+(/[a-z0-9_@.\-]+)+$")


class RunFolder:
    """Owns the files of one run; appends are line-buffered so a killed run keeps every finished step."""

    def __init__(self, root: Path | str, resume: bool):
        self.root = Path(root)
        if self.root.exists() and (self.root / "metrics.jsonl").exists() and not resume:
            raise ValueError(
                f"run.name: run folder {self.root} already holds a run; pass run.resume=latest to continue "
                "it or choose another run.name"
            )
        self.root.mkdir(parents=True, exist_ok=True)

    def write_config(self, yaml_text: str) -> None:
        (self.root / "config.yaml").write_text(yaml_text)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Append one step's metrics; names must be lowercase ``namespace/name``, values finite numbers."""
        for name, value in metrics.items():
            if not METRIC_NAME.match(name):
                raise ValueError(f"metric name {name!r}: use lowercase 'namespace/name' (e.g. reward/mean)")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"metric {name}: {value!r} is not a finite number")
        self._append("metrics.jsonl", {"step": step, **metrics})

    def log_trajectories(self, trajectories: list[Trajectory]) -> None:
        with open(self.root / "trajectories.jsonl", "a") as f:
            for t in trajectories:
                f.write(json.dumps(to_record(t)) + "\n")

    def read_metrics(self) -> list[dict]:
        path = self.root / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def _append(self, name: str, record: dict) -> None:
        with open(self.root / name, "a") as f:
            f.write(json.dumps(record) + "\n")
