"""Trainer checkpoints and HF export.

One rank trains a step at TP=1 and writes a run checkpoint (``megatron_rl.checkpoint`` around
``MegatronPolicy.save``) and an HF export. A second run is SIGKILLed mid-save (shard files written,
``metadata.json`` not yet): the tracker still names the first checkpoint, the partial folder is
refused, and two ranks at TP=2 load the first checkpoint with the same log-probs, then take the same
next step (optimizer and schedule restored). transformers loads the exports (TP=1, TP=2, and PP=2
with one shard file per stage) with Megatron's log-probs.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch
from parallel_launch import run_ranks, start_ranks
from parallel_ranks import checkpoint_rank, export_key_rank, export_specs_rank, stalled_save_rank, trainer_config
from test_parallel_parity import hf_reference

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.checkpoint import latest_checkpoint
from megatron_rl.schedules.weight_sync import checkpoint_specs
from parallel.config import OptimizerConfig

TOL = 1e-5
STEP_TOL = 1e-4  # after a further Adam step from TP=1 vs TP=2 gradients (equal to ~1e-7)


def _cfg(tp=1, pp=1):
    optimizer = OptimizerConfig(lr=1e-3, min_lr=1e-4, lr_decay_steps=3, lr_decay_style="linear")
    return trainer_config(tp=tp, pp=pp, max_tokens_per_micro_batch=24, optimizer=optimizer)


@pytest.fixture(scope="module")
def graded(batch):
    out = batch.select(list(range(batch.num_rows)))
    out.advantages = out.loss_mask * torch.tensor([1.0, -1.0, 1.0])[:, None]
    return out


@pytest.fixture(scope="module")
def saved(tiny, graded, tmp_path_factory):
    """(run root, HF export dir, TP=1 result) after one step and a checkpoint at step 1."""
    base = tmp_path_factory.mktemp("ckpt")
    root, hf_out = base / "run", base / "hf"
    (result,) = run_ranks(checkpoint_rank, 1, base, tiny["qwen3"], _cfg(), AlgorithmConfig(), graded, None, root, hf_out)
    return root, hf_out, result


@pytest.fixture(scope="module")
def killed(tiny, graded, saved, tmp_path_factory):
    """The run root after a save of step 2 was SIGKILLed between its shard files and metadata.json."""
    root = saved[0]
    out = tmp_path_factory.mktemp("killed")
    flag = out / "stalled"
    (proc,) = start_ranks(stalled_save_rank, 1, out, tiny["qwen3"], _cfg(), AlgorithmConfig(), graded, root, flag)
    deadline = time.monotonic() + 240
    while not flag.exists() and proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert flag.exists(), f"the save never reached its last file (exit code {proc.exitcode})"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    return root


@pytest.fixture(scope="module")
def loaded_tp2(tiny, graded, killed, tmp_path_factory):
    path, loop_state = latest_checkpoint(killed)
    out = tmp_path_factory.mktemp("tp2")
    ranks = run_ranks(
        checkpoint_rank, 2, out, tiny["qwen3"], _cfg(tp=2), AlgorithmConfig(), graded, path / "trainer", None, out / "hf",
        killed / "step_2.tmp" / "trainer",
    )
    return path, loop_state, ranks, out / "hf"


def test_killed_save_leaves_previous_checkpoint_latest(killed):
    partial = killed / "step_2.tmp" / "trainer"
    assert any(partial.glob("*.distcp")), "the killed save should have written shard files"
    assert not (partial / "metadata.json").exists()
    assert not (killed / "step_2").exists()
    path, loop_state = latest_checkpoint(killed)
    assert path == killed / "step_1" and loop_state == {"step": 1}


def test_incomplete_checkpoint_is_refused(loaded_tp2):
    for *_, refused in loaded_tp2[2]:
        assert refused is not None and "incomplete" in refused and "step_2.tmp" in refused


def test_tp1_checkpoint_loads_at_tp2_with_identical_logprobs(saved, loaded_tp2):
    at_save, after_next, steps, _, _ = saved[2]
    _, _, ranks, _ = loaded_tp2
    for at_load, after_next_tp2, loaded_steps, _, _ in ranks:
        assert loaded_steps == steps == 1
        assert (at_load - at_save).abs().max() < TOL
        # the next step equals the TP=1 run's: Adam moments and the LR schedule were restored
        assert (after_next_tp2 - after_next).abs().max() < STEP_TOL
        assert (after_next_tp2 - at_load).abs().max() > 100 * STEP_TOL, "the next step should move the log-probs"


def test_hf_export_loads_in_transformers_with_megatron_logprobs(saved, loaded_tp2, graded, tiny):
    _, hf_out, (at_save, *_) = saved
    for export, want in ((hf_out, at_save), (loaded_tp2[3], loaded_tp2[2][0][0])):
        index = json.loads((export / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == {p.name for p in export.glob("*.safetensors")}
        assert (export / "tokenizer.json").exists() and (export / "config.json").exists()
        logp, _ = hf_reference(str(export), graded)
        assert (logp - want).abs().max() < TOL
    original, _ = hf_reference(tiny["qwen3"], graded)
    assert (original - at_save).abs().max() > 100 * TOL, "the export should hold the trained, not the original, weights"


def test_memory_report_counts_this_ranks_state(saved, loaded_tp2):
    one = saved[2][3]
    two = loaded_tp2[2][0][3]
    assert one["params"] > 0 and one["grads"] >= one["params"] and one["optimizer"] >= 2 * one["params"]
    assert one["rss"] > one["params"]
    assert two["params"] < one["params"]  # TP=2 holds about half of each split matrix


def test_pp2_export_writes_a_shard_per_stage_that_transformers_loads(tiny, graded, tmp_path):
    out = tmp_path / "hf"
    ranks = run_ranks(checkpoint_rank, 2, tmp_path, tiny["qwen3"], _cfg(pp=2), AlgorithmConfig(), graded, None, None, out)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert index["weight_map"]["model.embed_tokens.weight"] != index["weight_map"]["lm_head.weight"]
    logp, _ = hf_reference(str(out), graded)
    assert (logp - ranks[0][0]).abs().max() < TOL


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_bf16_export_matches_the_transfer_plan_of_its_checkpoint(arch, tiny, tmp_path):
    """The loop's plan says every tensor is in the trainer's dtype; megatron's torch norms keep float32
    weights in a bf16 model, and a sender refusing them left vLLM waiting on the H200."""
    (exported,) = run_ranks(export_specs_rank, 1, tmp_path, tiny[arch], trainer_config(dtype="bfloat16"))
    planned = {(s.name, s.shape, s.dtype) for s in checkpoint_specs(tiny[arch], "bfloat16")}
    assert set(exported) == planned


def test_an_export_of_views_keeps_its_static_key_across_steps_until_a_parameter_moves(tiny, batch, tmp_path):
    """A weight transfer replays its recorded pack while this key holds (``weight_transfer.sender``): the key
    and the addresses must stay through optimizer steps, which write the parameters in place, and change
    when one moves."""
    rewarded = batch.select(list(range(batch.num_rows)))
    rewarded.advantages = rewarded.loss_mask.clone()
    (out,) = run_ranks(export_key_rank, 1, tmp_path, tiny["qwen3"], _cfg(), AlgorithmConfig(), rewarded)
    seen, changed, exported = out
    (first, again, stepped, moved, copies), addresses = zip(*seen)
    assert first is not None and first == again == stepped
    assert changed == exported, "every exported view must show the step's new values"
    assert moved is not None and moved != first
    assert copies is None, "q, k and v of a GQA model are copies without row blocks: no static key"
    # the addresses (the replay's cheap first check) follow the key: same through the step, new when one moved
    assert addresses[0] is not None and addresses[0] == addresses[1] == addresses[2] != addresses[3]
    assert addresses[4] != addresses[0], "row blocks or not: two different recorded packs"
