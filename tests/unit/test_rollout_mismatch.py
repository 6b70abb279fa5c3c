"""Sampler/trainer mismatch metrics of a train step against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_rl.algorithms.mismatch import rollout_mismatch


def test_mismatch_metrics_count_live_tokens_only():
    # live tokens: trainer - sampler = 0.5, -1.0, 0.7 (the last is beyond ln 2 = 0.693 by a hair);
    # the masked token's huge gap counts nowhere
    trainer = torch.tensor([[-1.0, -2.0, -0.3, -5.0]])
    sampler = torch.tensor([[-1.5, -1.0, -1.0, -50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    m = rollout_mismatch(trainer, sampler, mask)
    assert m["policy/rollout_train_logprob_abs_diff"].item() == pytest.approx((0.5 + 1.0 + 0.7) / 3)
    assert m["policy/rollout_train_ratio_beyond_2x"].item() == pytest.approx(2 / 3)  # -1.0 and 0.7
    # k3 per token, with r = sampler - trainer: exp(r) - r - 1
    k3 = [math.exp(r) - r - 1 for r in (-0.5, 1.0, -0.7)]
    assert m["policy/rollout_train_k3_kl"].item() == pytest.approx(sum(k3) / 3)


def test_equal_log_probs_have_no_mismatch_and_an_empty_mask_gives_zeros():
    logp = torch.tensor([[-0.1, -3.0]])
    for value in rollout_mismatch(logp, logp.clone(), torch.ones(1, 2)).values():
        assert value.item() == 0
    for value in rollout_mismatch(logp, logp - 5, torch.zeros(1, 2)).values():
        assert value.item() == 0
