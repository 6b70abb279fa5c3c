"""``benchmarks/repro/stability.py --quick`` on CPU: two real ``tiny_moe_cpu`` runs under a bfloat16 sampler and the
fully asynchronous schedule (staleness 4), without a correction and with token TIS, and the table beside the
papers' claims (#24's smoke test: both runs train on a signal, every number is finite, each gets a verdict)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "repro" / "stability.py"


def _run(*args: str, timeout: int = 840) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[2])})


@pytest.mark.repro
@pytest.mark.timeout(900)
def test_stability_quick_run_prints_the_table_beside_the_published_claims(tmp_path):
    proc = _run("--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| R3, no correction |" in proc.stdout and "| R3 + token TIS |" in proc.stdout
    assert "TIS (Yao et al., 2025)" in proc.stdout
    report = json.loads((tmp_path / "stability.json").read_text())
    assert report["mismatch"] == {"inference.server.dtype": "bfloat16", "schedule.type": "fully_async",
                                  "schedule.staleness": 4}
    assert (tmp_path / "stability.png").stat().st_size > 10_000
    for name, (run,) in report["results"].items():
        assert run["verdict"] in ("held", "drifted", "collapsed"), (name, run)
        assert len(run["correct/steps"]) == len(run["reward/steps"]) == 2
        assert run["reward/first"] > 0, f"{name}: the 150-step SFT warm start must leave a reward to train on"
        numbers = [v for k, v in run.items() if isinstance(v, float)]
        assert all(math.isfinite(v) and v >= 0 for v in numbers), (name, run)
        assert 0 < run["k3_kl/mean"] < 0.5, f"{name}: a bfloat16, stale sampler must differ from the trainer"


def test_bad_flags_fail_in_one_line_naming_the_flag():
    proc = _run("--sft-steps", "zero", timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--sft-steps" in proc.stderr and "positive integer" in proc.stderr, proc.stderr
