"""GRPO on ``gridsim`` played through a real env server process (loopback) with a real vLLM server: rows
written by ``write-rows``; the server is stopped while step 1's episodes run and restarted 45 s later; an
env that fails every time takes its group out. The ledger holds every trajectory once, none lost."""

import os
import subprocess
import sys
import time
from collections import Counter

from env_server import TOKEN, TOKEN_ENV, EnvServer, health
from integration.test_train_job import records, train
from megatron_rl.tiny import make_tiny_model

DOWN_S = 45


def write_rows(url: str, out) -> None:
    cmd = [sys.executable, "-m", "megatron_rl.cli", "write-rows", url, str(out), "--tokenizer",
           str(make_tiny_model("qwen3", size="unit")), "--token-env", TOKEN_ENV, "--max-prompt-length", "1024"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, TOKEN_ENV: TOKEN}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "dropped_too_long: 0, train: 4, eval: 2"


def wait_for_sessions(server: EnvServer, proc, timeout: float = 600) -> int:
    deadline = time.time() + timeout
    while True:
        assert proc.poll() is None and time.time() < deadline, "training ended before any episode reached the server"
        sessions = (health(server.url) or {}).get("sessions", 0)
        if sessions >= 2:
            return sessions
        time.sleep(0.05)


def test_gridsim_through_a_restarting_env_server(tmp_path):
    os.environ[TOKEN_ENV] = TOKEN  # read where the generator runs
    server = EnvServer(tmp_path).start()
    try:
        write_rows(server.url, tmp_path / "rows")
        proc = train(tmp_path, "recipe=gridsim_cpu", "run.name=remote", "sft.steps=0", "schedule.total_steps=2",
                     "schedule.eval_every=0", "data.train_batch_size=4", "generator.n_samples_per_prompt=4",
                     "generator.max_env_attempts=3",
                     f"data.train_files=[{tmp_path / 'rows' / 'train.parquet'}]",
                     f"data.eval_files=[{tmp_path / 'rows' / 'eval.parquet'}]", wait=False)
        open_at_stop = wait_for_sessions(server, proc)
        server.stop()
        time.sleep(DOWN_S)
        server.start()
        assert proc.wait(timeout=900) == 0, (tmp_path / "log-0.txt").read_text()[-4000:]
    finally:
        if server.proc.poll() is None:
            server.stop()
    folder = tmp_path / "remote"
    steps = [m for m in records(folder, "metrics.jsonl") if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    # the failing group replays 4 x 2 times in every step; step 1 also replays the episodes the stop cut
    assert steps[1]["environment/replays"] == 8 and steps[0]["environment/replays"] > 8, steps
    assert all(m["generate/failed_groups"] == 1 and m["environment/failures"] == 4 for m in steps)
    assert all("environment/tool_calls" in m and m["environment/env_time"] > 0 for m in steps)
    ledger = records(folder, "trajectories.jsonl")
    want = Counter(f"{i}#{r}" for i in ("gridsim-5-0", "gridsim-5-1", "gridsim-5-2", "always-fails") for r in range(4))
    for step in (0, 1):  # group_step counts from 0; every trajectory of every group exactly once: none lost, none duplicated by a replay
        assert Counter(r["trajectory_id"] for r in ledger if r["group_step"] == step) == want
    for r in ledger:
        failed = r["trajectory_id"].startswith("always-fails")
        assert (r["stop_reason"] == "failed") == failed and (not any(r["loss_mask"])) == failed
    first = (tmp_path / "env-server-0.log").read_text()
    print(f"\nrestart: {open_at_stop} sessions open at the stop, server down {DOWN_S} s, "
          f"{steps[0]['environment/replays'] - 8:.0f} gridsim replays in step 1, which took {steps[0]['timing/step']:.0f} s "
          f"(step 2: {steps[1]['timing/step']:.0f} s)")
    assert "0 still open were closed" in first
