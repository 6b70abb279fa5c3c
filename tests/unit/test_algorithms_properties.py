"""Invariants of estimators, losses and aggregations on random shapes (hypothesis)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.registry import ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES

GROUP_ESTIMATORS = ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"]
CONFIG = AlgorithmConfig(gamma=0.9, lambd=0.8)


@st.composite
def batches(draw):
    b, t = draw(st.integers(1, 8)), draw(st.integers(1, 10))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    mask = torch.rand(b, t, generator=g) < draw(st.floats(0.1, 1.0))
    groups = torch.randint(0, draw(st.integers(1, 4)), (b,), generator=g)
    token_rewards = draw(st.booleans())
    rewards = torch.randn((b, t) if token_rewards else (b,), generator=g)
    values = torch.randn(b, t, generator=g)
    return mask, groups, rewards, values, g


def _with_garbage(t, mask, garbage):
    t = t.clone()
    if t.dim() == 2:
        t[~mask] = garbage
    return t


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from(ADVANTAGE_ESTIMATORS.names()), st.sampled_from([float("nan"), 1e30]))
def test_estimators_ignore_masked_garbage_and_zero_masked_positions(batch, name, garbage):
    mask, groups, rewards, values, _ = batch
    fn = ADVANTAGE_ESTIMATORS.get(name)
    clean, _ = fn(rewards, mask, groups, CONFIG, values)
    dirty, _ = fn(_with_garbage(rewards, mask, garbage), mask, groups, CONFIG, _with_garbage(values, mask, garbage))
    assert torch.equal(clean, dirty)
    assert torch.isfinite(clean).all()
    assert clean[~mask].eq(0).all()


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from(GROUP_ESTIMATORS), st.floats(-5, 5))
def test_equal_rewards_within_groups_give_zero(batch, name, level):
    mask, groups, _, _, _ = batch
    rewards = groups.float() * 0.7 + level  # equal inside each group, different across
    advantages, _ = ADVANTAGE_ESTIMATORS.get(name)(rewards, mask, groups, CONFIG)
    assert advantages.eq(0).all()


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_group_advantages_sum_to_zero_over_live_members(batch, name):
    mask, groups, rewards, _, _ = batch
    advantages, _ = ADVANTAGE_ESTIMATORS.get(name)(rewards, mask, groups, CONFIG)
    per_seq = advantages.sum(-1) / mask.sum(-1).clamp(min=1)
    for gid in groups.unique():
        assert abs(per_seq[groups == gid].sum().item()) < 1e-4


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from(POLICY_LOSSES.names()), st.sampled_from(LOSS_AGGREGATIONS.names()))
def test_losses_ignore_masked_garbage_in_value_and_gradient(batch, name, mode):
    mask, _, _, _, g = batch
    b, t = mask.shape
    old = -torch.rand(b, t, generator=g) * 3
    base = old + 0.3 * torch.randn(b, t, generator=g)
    rollout = old + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, t, generator=g)
    config = AlgorithmConfig(policy_loss_type=name, loss_agg_mode=mode, loss_agg_norm_length=t)
    out = []
    for garbage in (None, float("nan")):
        tensors = [x.clone() for x in (base, old, adv, rollout)]
        if garbage is not None:
            for x in tensors:
                x[~mask] = garbage
        lp = tensors[0].requires_grad_(True)
        torch.manual_seed(0)
        token_loss, _ = POLICY_LOSSES.get(name)(lp, tensors[1], tensors[2], mask, config, tensors[3])
        loss = LOSS_AGGREGATIONS.get(mode)(token_loss, mask, t)
        loss.backward()
        out.append((loss.detach(), lp.grad))
    assert torch.equal(out[0][0], out[1][0])
    assert torch.equal(out[0][1], out[1][1])
    assert torch.isfinite(out[0][1]).all()
