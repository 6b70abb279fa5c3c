"""What the reproduction scripts share: flag errors in one line that names the flag, and real training runs
(``megatron-rl train``) whose per-step metrics a script tabulates."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """``error`` prints ``<prog>: <message>`` on one line (no usage dump) and exits 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def train(out: Path, run_name: str, words: list[str], prog: str, steps: int | None = None) -> list[dict]:
    """One ``megatron-rl train`` run named ``run_name`` under ``out/runs`` with the override ``words``; the
    metrics of its RL steps. A failed run stops the script, naming the run and the tail of its log. A run whose
    folder already holds ``steps`` RL steps with the same overrides is read instead of run again."""
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    log, done = runs / f"{run_name}.log", runs / run_name / "repro_words.json"
    if steps and done.exists() and json.loads(done.read_text()) == words:
        rows = _rl_steps(runs / run_name)
        if len(rows) == steps:
            return rows
    if (runs / run_name).exists():
        raise SystemExit(f"{prog}: {runs / run_name} holds a run with other settings or one cut short; "
                         f"remove it, or pass another --out")
    with open(log, "w") as f:
        code = subprocess.run([sys.executable, "-m", "megatron_rl.cli", "train", f"run.output_dir={runs}",
                               f"run.name={run_name}", *words], stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    if code != 0:
        raise SystemExit(f"{prog}: run {run_name} failed (exit {code}); its log: {log}\n" + log.read_text()[-3000:])
    done.write_text(json.dumps(words))
    return _rl_steps(runs / run_name)


def _rl_steps(run_dir: Path) -> list[dict]:
    return [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "reward/mean" in m]


def median_range(values: list, pct: bool) -> str:
    """The median over seeds with (min-max) where there are several, as a percentage or in e-notation; "-" where
    a run logged none."""
    if any(v is None for v in values):
        return "-"
    mid = statistics.median(values)
    text = f"{100 * mid:.2f}%" if pct else f"{mid:.2e}"
    if len(values) > 1:
        lo, hi = min(values), max(values)
        text += f" ({100 * lo:.2f}-{100 * hi:.2f}%)" if pct else f" ({lo:.1e}-{hi:.1e})"
    return text


def publish(out: Path, name: str, report: dict, plot: Callable[[Path], None], table: str) -> None:
    """Write ``name``.json (``report`` and the command line) and ``name``.png (``plot(path)``) under ``out``;
    print the table and where they went."""
    (out / f"{name}.json").write_text(json.dumps({"command": " ".join(["python", *sys.argv]), **report}, indent=1))
    plot(out / f"{name}.png")
    print(table)
    print(f"\nwrote {out / f'{name}.json'} and {out / f'{name}.png'}")
