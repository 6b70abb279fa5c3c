"""``benchmarks/bench_gpu_transfer.py --dry-run`` on CPU: the GPU benchmark's whole path (random checkpoint,
megatron trainer process, vLLM engine, coordinator over gloo broadcast, log-prob checks against megatron and
transformers) on a tiny model, for both trainers: a ``MegatronPolicy`` and the megatron model's weights alone
(``--trainer model``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_gpu_transfer.py"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("trainer", ["policy", "model"])
def test_gpu_transfer_benchmark_dry_run(tmp_path, trainer):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--dry-run", "--trainer", trainer, "--json", str(out)],
                          env={**os.environ, "PYTHONPATH": str(BENCH.parents[1])}, capture_output=True, text=True,
                          timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())["results"]["tiny"]
    assert [row["before"] for row in res["rows"]] == ["idle", "forward"], "one row per --before-send mode"
    for row in res["rows"]:
        assert row["buckets"] > 1 and row["bytes"] > 1e6 and row["gbps"] > 0
        assert row["load"] == "reload", "vLLM on CPU repacks its weights: auto must load through reload_weights"
        assert 0 < row["receive_worker_s"] <= row["receive_s"] <= row["transfer_s"] and 0 < row["send_s"] <= row["transfer_s"], row
    checks = res["logprobs"]["auto"]
    assert checks["ok"], checks
    for engine in ("megatron", "transformers"):
        lp = checks[engine]
        assert lp["max"] < 1e-3 and lp["before_max"] > 2 * lp["max"], (engine, lp)  # float32 on CPU: no bf16 drift
