"""``benchmarks/repro/r2_vs_r3.py --quick`` on CPU: two real ``tiny_moe_cpu`` runs with a bfloat16 vLLM sampler
and each batch cut into 2 optimizer steps, one under R2 and one under R3, and the table beside the claim of
Qwen's "Stabilizing RL with LLMs" (#24's smoke test: both replays compare routing, every number is finite, a run
already in the output folder is read rather than run again)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "repro" / "r2_vs_r3.py"


def _run(*args: str, timeout: int = 840) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[2])})


@pytest.mark.repro
@pytest.mark.timeout(900)
def test_r2_vs_r3_quick_run_prints_the_table_beside_the_published_claim(tmp_path):
    proc = _run("--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| 2 | r2 |" in proc.stdout and "| 2 | r3 |" in proc.stdout and "R2 suffices" in proc.stdout
    report = json.loads((tmp_path / "r2_vs_r3.json").read_text())
    assert (tmp_path / "r2_vs_r3.png").stat().st_size > 10_000
    r2, r3 = report["results"]["2/r2"][0], report["results"]["2/r3"][0]
    for run in (r2, r3):
        assert all(math.isfinite(v) and v >= 0 for v in run.values()), run
        assert run["policy/ppo_kl"] > 0, "the second mini-batch trains a policy one optimizer step on"
        assert 0 < run["policy/rollout_train_k3_kl"] < 0.1, "a bfloat16 sampler differs from the float32 trainer"
    assert 0 < r2["routing/disagreement"] < 0.5, "R2: experts changed since the old-log-prob pass"
    assert 0 < r3["routing/disagreement"] < 0.5, "R3: the trainer's own routers against the sampler's"

    start = time.monotonic()
    again = _run("--quick", "--out", str(tmp_path), timeout=120)
    assert again.returncode == 0 and time.monotonic() - start < 60, "finished runs are read, not run again"
    assert json.loads((tmp_path / "r2_vs_r3.json").read_text())["results"] == report["results"]


def test_bad_flags_fail_in_one_line_naming_the_flag():
    proc = _run("--steps", "-1", timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--steps" in proc.stderr and "positive integer" in proc.stderr, proc.stderr
