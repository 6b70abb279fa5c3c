"""``megatron-rl train`` end to end on CPU: real vLLM, real megatron-core over gloo, real weight transfer."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integration.test_cli_startup import MARKER, marked

QUICK = ["sft.steps=2", "schedule.total_steps=2", "schedule.eval_every=0"]


def train(tmp_path: Path, *words: str, wait: bool = True):
    cmd = [sys.executable, "-m", "megatron_rl.cli", "train", f"run.output_dir={tmp_path}", *words]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", MARKER: str(tmp_path)}  # inherited by all it starts
    log = open(tmp_path / f"log-{len(list(tmp_path.glob('log-*')))}.txt", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    if not wait:
        return proc
    code = proc.wait(timeout=1200)
    assert code == 0, Path(log.name).read_text()[-4000:]
    return proc


def records(folder: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


@pytest.mark.parametrize("recipe", ["text2sql_cpu", "gridsim_cpu"])
def test_multi_turn_recipes_write_observations_with_mask_zero(recipe, tmp_path):
    # gridsim's recipe samples 16 x 8 two-turn episodes a step to learn; 4 x 4 show the observations as well
    train(tmp_path, f"recipe={recipe}", *QUICK, "data.train_batch_size=4", "generator.n_samples_per_prompt=4")
    folder = tmp_path / recipe
    steps = [m for m in records(folder, "metrics.jsonl") if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    ledger = records(folder, "trajectories.jsonl")
    multi = [r for r in ledger if 0 in r["loss_mask"] and 1 in r["loss_mask"][r["loss_mask"].index(0):]]
    assert multi, "no trajectory with an observation between two sampled turns"
    for r in multi:
        obs = [i for i, m in enumerate(r["loss_mask"]) if m == 0]
        assert all(r["rollout_logprobs"][i] == 0.0 for i in obs)
    assert (folder / "curves.png").stat().st_size > 0


def test_moe_recipe_trains_with_expert_parallel_and_r3(tmp_path):
    # sampled at 0.8: vLLM returns the tempered log-probs and the trainer scores the batch at the same temperature
    train(tmp_path, "recipe=tiny_moe_cpu", "weight_transfer.transport.type=auto", "generator.temperature=0.8", *QUICK)
    assert "weight_transfer: transport auto -> shared_memory (GPU False, colocated False, same host True" in (
        tmp_path / "log-0.txt").read_text(), "one CPU host: auto picks shared memory"
    folder = tmp_path / "tiny_moe_cpu"
    steps = [m for m in records(folder, "metrics.jsonl") if "reward/mean" in m]
    assert len(steps) == 2 and all(m["generate/with_routed_experts"] == 1.0 for m in steps)
    assert all(r["routed_experts"] is not None for r in records(folder, "trajectories.jsonl"))
    assert all(m["weight_transfer/quarantined"] == 0 for m in steps)
    # vLLM serves the trainer's weights: its log-probs of the sampled tokens equal the trainer's (1.7e-7 at 1.0;
    # 0.036 when the CPU MoE experts were reloaded without vLLM's prepacking, see vllm_receiver).
    # (the first of the batch's four optimizer steps: later ones run on weights the update has moved)
    assert all(m["policy/rollout_train_logprob_abs_diff_first"] < 1e-4 for m in steps), steps
    assert all(m["policy/rollout_train_ratio_beyond_2x_first"] == 0 for m in steps), steps
    # The trainer's routers (the earlier layers replayed) choose the experts vLLM chose: measured 0 of the
    # token-layer pairs, float32 on both sides; a record shifted by one token would disagree on most.
    assert all(0 <= m["routing/disagreement_first"] < 0.01 for m in steps), steps
    assert not [k for m in records(folder, "metrics.jsonl") for k in m if k.startswith("sft/rollout_train")]


def test_dynamic_sampling_samples_groups_until_enough_vary_and_trains_on_the_first(tmp_path):
    """DAPO dynamic sampling: a step samples extra groups until 4 of them carry a signal or 4 rounds have run,
    trains on the first 4 that do, and every group it sampled is in the ledger."""
    train(tmp_path, "model.tiny_size=unit", "sft.steps=60", "data.train_batch_size=4", "generator.n_samples_per_prompt=4",
          "schedule.total_steps=2", "schedule.eval_every=0", "algorithm.filters.dynamic_sampling_type=replace",
          "algorithm.filters.dynamic_sampling_target_groups=4", "algorithm.filters.dynamic_sampling_max_rounds=4")
    folder = tmp_path / "tiny_cpu"
    steps = [m for m in records(folder, "metrics.jsonl") if "reward/mean" in m]
    assert len(steps) == 2
    for m in steps:
        groups, rounds = m["generate/dynamic_sampling_groups"], m["generate/dynamic_sampling_rounds"]
        useful = round((1 - m["reward/zero_variance_group_ratio"]) * groups)
        assert 1 <= rounds <= 4 and 4 <= groups <= 4 * rounds, m
        assert rounds == 4 or useful >= 4, "sampling stops early only once 4 groups vary"
        assert m["reward/dynamic_sampling_missing_groups"] == 4 - min(useful, 4)
        assert m["train/kept_trajectories"] == 4 * min(useful, 4)
    ledger = records(folder, "trajectories.jsonl")
    assert len(ledger) == 4 * sum(m["generate/dynamic_sampling_groups"] for m in steps)
    assert sum(m["generate/dynamic_sampling_groups"] for m in steps) > 8, "extra rounds must have run"


def _kill_after_a_checkpoint(folder: Path, proc, timeout: float = 1200) -> int:
    """SIGKILL the run (its whole process group) once it has checkpointed a step; the step it can resume from.
    RL steps here take ~0.3 s, so the tracker is polled often: the run must not finish between two polls."""
    tracker = folder / "checkpoints" / "latest_checkpointed_step.txt"
    deadline = time.time() + timeout
    while not (tracker.exists() and tracker.read_text().strip()):
        assert proc.poll() is None and time.time() < deadline, "run ended before its first checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for left in marked(str(folder.parent)):  # what it started outside its group: Ray's GCS, raylet, workers
        left.kill()  # (``ray stop`` would stop every other run on the machine too)
    return int(tracker.read_text().strip())


def test_a_killed_ppo_run_resumes_and_matches_an_uninterrupted_one(tmp_path):
    """PPO with a critic and both KL forms, so the resume must restore policy, critic and reference."""
    # 60 SFT steps at a high LR make the unit model earn mixed rewards, so later steps have a real gradient.
    total = 6
    common = ["recipe=tiny_ppo_cpu", "algorithm.kl.use_kl_loss=true", "model.tiny_size=unit", "sft.steps=60",
              "trainer.optimizer.lr=3e-3", "trainer.optimizer.lr_decay_steps=63", f"schedule.total_steps={total}",
              "schedule.checkpoint_every=1", "schedule.eval_every=0", "data.train_batch_size=4"]
    (tmp_path / "a").mkdir()
    train(tmp_path / "a", "run.name=whole", *common)
    (tmp_path / "b").mkdir()
    proc = train(tmp_path / "b", "run.name=cut", *common, wait=False)
    saved_step = _kill_after_a_checkpoint(tmp_path / "b" / "cut", proc)
    assert saved_step < total, f"the run finished all {total} steps before it could be killed"
    saved = tmp_path / "b" / "cut" / "checkpoints" / f"step_{saved_step}" / "trainer"
    assert sorted(p.name for p in saved.iterdir()) == ["critic", "policy", "reference"]
    train(tmp_path / "b", "run.name=cut", "run.resume=latest", *common)
    whole = {m["step"]: m for m in records(tmp_path / "a" / "whole", "metrics.jsonl") if "reward/mean" in m}
    # a step trained after the last checkpoint and before the kill is trained again: its last record counts
    cut = {m["step"]: m for m in records(tmp_path / "b" / "cut", "metrics.jsonl") if "reward/mean" in m}
    assert sorted(cut) == list(range(1, total + 1))
    resumed = list(range(saved_step + 1, total + 1))
    assert any(whole[s]["reward/mean"] > 0 and whole[s]["policy/grad_norm"] > 0 for s in resumed), \
        f"a resumed step ({resumed}) must carry a gradient"
    assert any(whole[s]["critic/grad_norm"] > 0 and whole[s]["policy/kl"] > 0 for s in resumed), \
        "critic and reference must take part"
    keys = ("reward/mean", "generate/response_length", "policy/loss", "policy/grad_norm", "policy/kl",
            "reward/kl_penalty", "critic/value_mean", "critic/abs_error", "critic/grad_norm")
    for step in resumed:
        for key in keys:
            assert cut[step][key] == pytest.approx(whole[step][key], rel=1e-4, abs=1e-5), (step, key)
