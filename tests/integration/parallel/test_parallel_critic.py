"""The critic (TP=2): starts at zero from the policy checkpoint, its clipped value loss falls on a fixed
batch, and a saved critic loads into a fresh one (sharing the process groups) with the same values."""

from __future__ import annotations

import pytest
import torch
from parallel_launch import run_ranks
from parallel_ranks import critic_rank, trainer_config

from parallel.config import CriticConfig, OptimizerConfig

STEPS = 12


@pytest.fixture(scope="module")
def trained(tiny, batch, tmp_path_factory):
    returns = batch.loss_mask * torch.tensor([1.0, -0.5, 0.25])[:, None]
    cfg = trainer_config(tp=2, max_tokens_per_micro_batch=20, optimizer=OptimizerConfig(lr=3e-3))
    out = tmp_path_factory.mktemp("critic")
    ranks = run_ranks(
        critic_rank, 2, out, tiny["qwen3"], cfg, CriticConfig(value_clip=0.2), batch, returns, STEPS, out / "ckpt"
    )
    return returns, ranks


def _loss(values, returns, mask):
    return float(0.5 * (((values - returns) ** 2) * mask).sum() / mask.sum())


def test_zero_head_starts_every_value_at_zero(trained):
    for initial, *_ in trained[1]:
        assert torch.equal(initial, torch.zeros_like(initial))


def test_value_loss_decreases_on_a_fixed_batch(trained, batch):
    returns, ranks = trained
    (_, history, final, _), (_, _, final1, _) = ranks
    losses = [_loss(v, returns, batch.loss_mask) for v, _ in history]
    final_loss = _loss(final, returns, batch.loss_mask)
    assert final_loss < 0.2 * losses[0], (losses, final_loss)
    assert all(m["critic/grad_norm"] > 0 for _, m in history)
    assert losses[-1] < losses[0]
    assert history[0][1]["critic/abs_error"] == pytest.approx(float((returns.abs() * batch.loss_mask).sum() / batch.loss_mask.sum()), abs=1e-5)
    assert torch.allclose(final, final1, atol=1e-5), "TP ranks must agree on the values"


def test_values_are_zero_on_padding(trained, batch):
    final = trained[1][0][2]
    assert torch.equal(final[batch.attention_mask == 0], torch.zeros(int((batch.attention_mask == 0).sum())))


def test_saved_critic_loads_with_the_same_values(trained):
    for _, _, final, reloaded in trained[1]:
        assert (reloaded - final).abs().max() < 1e-6
        assert final.abs().max() > 0.1
