"""``megatron-rl train`` end to end on one GPU: the colocated recipes (trainer rank and vLLM engine share the
GPU, weights over CUDA IPC), shortened, on the unit-size model; the MoE one with rollout routing replay."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHORT = ["model.tiny_size=unit", "sft.steps=10", "sft.batch_size=64", "data.train_batch_size=16",
         "data.num_generated_eval=16", "schedule.total_steps=3", "schedule.eval_every=3", "schedule.checkpoint_every=2"]


def _train(tmp_path: Path, *words: str) -> None:
    cmd = [sys.executable, "-m", "megatron_rl.cli", "train", f"run.output_dir={tmp_path}", *words]
    log = tmp_path / f"log-{len(list(tmp_path.glob('log-*')))}.txt"
    with open(log, "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                              timeout=1200).returncode
    assert code == 0, log.read_text()[-4000:]


def _steps(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [m for m in rows if "reward/mean" in m]


@pytest.mark.parametrize("recipe", ["tiny_gpu", "tiny_moe_gpu"])
def test_colocated_recipe_trains_syncs_and_resumes_on_one_gpu(recipe, tmp_path):
    _train(tmp_path, f"recipe={recipe}", *SHORT)
    folder = tmp_path / recipe
    steps = _steps(folder)
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["weight_transfer/quarantined"] == 0 for m in steps)
    assert all(m["policy/weight_version"] == m["step"] + 1 for m in steps), "one update per step after SFT's"
    # vLLM serves the trainer's weights: after SFT moved them far from the random init, the engines' log-probs
    # of the sampled tokens stay within bf16 kernel noise of the trainer's (a stale engine differs by nats).
    assert all(m["policy/rollout_train_logprob_abs_diff"] < 0.1 for m in steps), steps
    if recipe == "tiny_moe_gpu":
        assert all(m["generate/with_routed_experts"] == 1.0 for m in steps)
    assert (folder / "curves.png").stat().st_size > 0
    _train(tmp_path, f"recipe={recipe}", *SHORT, "schedule.total_steps=4", "run.resume=latest")
    assert [m["step"] for m in _steps(folder)][-1] == 4
