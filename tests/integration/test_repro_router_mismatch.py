"""``benchmarks/repro/router_mismatch.py --quick`` on CPU: three real ``tiny_moe_cpu`` runs (float32 and bfloat16
vLLM samplers, with and without R3) and the table beside the R3 paper's numbers (#24's smoke test: the control
agrees exactly, a bfloat16 sampler's routers disagree on some but not most token-layer pairs, replay is what
makes the comparison, and every number is finite)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "repro" / "router_mismatch.py"


def _run(*args: str, timeout: int = 840) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[2])})


@pytest.mark.repro
@pytest.mark.timeout(900)
def test_router_mismatch_quick_run_prints_the_table_beside_the_published_numbers(tmp_path):
    proc = _run("--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "R3 (Ma et al., arXiv 2510.11370)" in proc.stdout and "k3 KL without replay / with R3" in proc.stdout
    report = json.loads((tmp_path / "router_mismatch.json").read_text())
    assert (tmp_path / "router_mismatch.png").stat().st_size > 10_000
    results = {name: runs[0] for name, runs in report["results"].items()}
    control, bf16, free = (results[k] for k in ("float32 sampler, R3 (control)", "bfloat16 sampler, R3",
                                                  "bfloat16 sampler, no replay"))
    assert control["routing/disagreement"] == 0 and control["routing/tokens_differing"] == 0, control
    assert control["policy/rollout_train_logprob_abs_diff"] < 1e-5, "float32 engines agree on the log-probs"
    assert 0 < bf16["routing/disagreement"] < 0.5 and bf16["routing/tokens_differing"] >= bf16["routing/disagreement"]
    assert bf16["policy/rollout_train_logprob_abs_diff"] > 1e-4, "a bfloat16 sampler must differ measurably"
    assert free["routing/disagreement"] is None, "without replay nothing is compared"
    for run in (control, bf16, free):
        assert all(v is None or (math.isfinite(v) and v >= 0) for v in run.values()), run


def test_bad_flags_fail_in_one_line_naming_the_flag():
    proc = _run("--seeds", "0", timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--seeds" in proc.stderr and "positive integer" in proc.stderr, proc.stderr
