"""GRPO updates on a fixed batch make positive-advantage tokens likelier (TP=2, EP=2, and one rank)."""

from __future__ import annotations

import pytest
import torch
from parallel_launch import run_ranks
from parallel_ranks import batch_of, lr_rank, train_rank, trainer_config

from megatron_rl.algorithms.config import AlgorithmConfig
from parallel.config import OptimizerConfig


@pytest.fixture(scope="module")
def graded_batch():
    """Four rows; the first two carry advantage +1 on their responses, the others -1."""
    g = torch.Generator().manual_seed(1)
    batch = batch_of([torch.randint(3, 2000, (n,), generator=g).tolist() for n in (10, 8, 9, 6)], prompt_len=3)
    sign = torch.tensor([1.0, 1.0, -1.0, -1.0])[:, None]
    batch.advantages = batch.loss_mask * sign
    return batch


def run_grpo(arch, layout, world, tiny, batch, tmp_path, steps=20):
    cfg = trainer_config(**layout, max_tokens_per_micro_batch=20, optimizer=OptimizerConfig(lr=3e-3, clip_grad=1.0))
    algo = AlgorithmConfig(advantage_estimator="grpo", policy_loss_type="regular")
    return run_ranks(train_rank, world, tmp_path, tiny[arch], cfg, algo, batch, steps)


@pytest.mark.parametrize("arch,layout", [("qwen2", dict(tp=2)), ("qwen3_moe", dict(ep=2))], ids=["qwen2-tp2", "qwen3_moe-ep2"])
def test_grpo_lowers_positive_advantage_nll(arch, layout, tiny, graded_batch, tmp_path):
    ranks = run_grpo(arch, layout, 2, tiny, graded_batch, tmp_path)
    for before, after, metrics in ranks:
        assert after < before - 0.5, (before, after)
    before0, after0, _ = ranks[0]
    assert ranks[1][0] == pytest.approx(before0, abs=1e-5) and ranks[1][1] == pytest.approx(after0, abs=1e-5)
    last = ranks[-1][2][-1]
    assert last["policy/grad_norm"] > 0 and last["policy/lr"] == pytest.approx(3e-3)
    assert last["perf/loss_tokens"] == float(graded_batch.loss_mask.sum())
    assert last["perf/micro_batches"] >= 1


def test_steps_at_their_own_rate_leave_the_schedule_where_it_was(tiny, graded_batch, tmp_path):
    """The SFT warm start's ``sft.lr``: its steps run at that rate, then RL's cosine starts at its own step 0."""
    optimizer = OptimizerConfig(lr=1e-3, min_lr=1e-4, lr_decay_style="cosine", lr_decay_steps=2)
    cfg = trainer_config(max_tokens_per_micro_batch=20, optimizer=optimizer)
    algo = AlgorithmConfig(advantage_estimator="grpo", policy_loss_type="regular")
    [(warm, scheduled)] = run_ranks(lr_rank, 1, tmp_path, tiny["qwen3"], cfg, algo, graded_batch, 5e-4, 3, 3)
    assert warm == pytest.approx([5e-4] * 3)
    assert scheduled == pytest.approx([1e-3, 5.5e-4, 1e-4])  # cosine from its step 0, not from step 3
