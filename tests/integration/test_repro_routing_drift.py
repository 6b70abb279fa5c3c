"""``benchmarks/repro/routing_drift.py --quick`` on CPU: a random tiny Qwen3-MoE, a real megatron-core trainer,
one real update per learning rate, the routing compared before and after (#24's smoke test: the table and
the plot are produced, every number is a fraction, the no-update control is exactly zero and a large step
moves experts)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "repro" / "routing_drift.py"


def _run(*args: str, timeout: int = 540) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[2])})


@pytest.mark.timeout(600)
def test_routing_drift_quick_run_prints_the_table_beside_the_published_number(tmp_path):
    proc = _run("--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "GSPO (Qwen, arXiv 2507.18071)" in proc.stdout and "no update (control)" in proc.stdout, proc.stdout
    report = json.loads((tmp_path / "routing_drift.json").read_text())
    assert (tmp_path / "routing_drift.png").stat().st_size > 10_000
    [tiny] = report["results"]
    assert [u["lr"] for u in tiny["updates"]] == [1e-6, 1e-3]
    for u in tiny["updates"]:
        assert len(u["per_layer"]) == tiny["layers"] and u["tokens"] == 4 * 64
        for value in (*u["per_layer"], u["mean"], u["tokens_any_layer"]):
            assert math.isfinite(value) and 0 <= value <= 1, u
        assert math.isfinite(u["grad_norm"]) and u["grad_norm"] > 0, u
    control = tiny["updates"][0]["control"]
    assert control["mean"] == 0 and control["tokens_any_layer"] == 0, "the same weights must route the same on CPU"
    small, large = tiny["updates"]
    assert large["mean"] > 0.01 and large["mean"] >= small["mean"], (small, large)


def test_bad_flags_fail_in_one_line_naming_the_flag(tmp_path):
    proc = _run("--rows", "6", "--group", "4", "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--group" in proc.stderr and "does not divide --rows 6" in proc.stderr, proc.stderr
    proc = _run("--shapes", "huge", timeout=60)
    assert proc.returncode == 2 and "unknown shape 'huge'" in proc.stderr, proc.stderr
