"""Hand-computed advantages for every estimator, with ragged groups, per-turn rewards and garbage."""

import math

import pytest
import torch

from megatron_rl.algorithms.advantages import returns_to_go
from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.registry import ADVANTAGE_ESTIMATORS

REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0])
GROUPS = torch.tensor([0, 0, 0, 0, 7])
MASK = torch.ones(5, 3)
GROUP_ESTIMATORS = ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"]


def _adv(name, rewards=REWARDS, mask=MASK, groups=GROUPS, values=None, **cfg):
    advantages, metrics = ADVANTAGE_ESTIMATORS.get(name)(
        rewards, mask, groups, AlgorithmConfig(**cfg), values
    )
    return advantages, metrics


def _per_seq(advantages):
    return advantages[:, 0].tolist()


def test_grpo_normalises_by_unbiased_group_std():
    advantages, metrics = _adv("grpo", advantage_epsilon=0.0)
    a = 0.5 / math.sqrt(1 / 3)  # group 0: mean 0.5, unbiased std sqrt(1/3); group 7 alone: 0
    assert _per_seq(advantages) == pytest.approx([a, -a, a, -a, 0.0])
    assert torch.equal(advantages, advantages[:, :1].expand(5, 3))
    assert metrics["policy/advantages_max"].item() == pytest.approx(a)


def test_grpo_without_std_and_dr_grpo_only_centre():
    expected = [0.5, -0.5, 0.5, -0.5, 0.0]
    assert _per_seq(_adv("grpo", grpo_norm_by_std=False)[0]) == pytest.approx(expected)
    assert _per_seq(_adv("dr_grpo")[0]) == pytest.approx(expected)


def test_rloo_leaves_one_out():
    assert _per_seq(_adv("rloo")[0]) == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3, 0.0])


def test_reinforce_pp_baseline_whitens_over_batch_tokens():
    a = 0.5 / math.sqrt(0.2)  # 15 tokens: twelve at +-0.5, three at 0 -> population std sqrt(0.2)
    assert _per_seq(_adv("reinforce_pp_baseline")[0]) == pytest.approx([a, -a, a, -a, 0.0], abs=1e-6)


def test_per_turn_rewards_accumulate_in_group_scores():
    token_rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    advantages, _ = _adv("dr_grpo", token_rewards, mask, torch.tensor([0, 0]))
    assert advantages.tolist() == [[1.0, 1.0, 0.0, 1.0], [-1.0, -1.0, -1.0, -1.0]]  # scores 3 and 1


def test_returns_to_go_skip_masked_tokens():
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0]])
    live = torch.tensor([[True, True, False, True]])
    assert returns_to_go(rewards, live, 1.0).tolist() == [[3.0, 3.0, 0.0, 2.0]]
    assert returns_to_go(rewards, live, 0.5).tolist() == [[1.0, 2.0, 0.0, 2.0]]


def test_reinforce_pp_whitens_discounted_returns():
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    advantages, _ = _adv("reinforce_pp", rewards, mask, torch.tensor([0, 1]), gamma=0.5)
    returns = torch.tensor([1.0, 2.0, 2.0, 0.0])  # live tokens, in order
    whitened = (returns - returns.mean()) / returns.std(unbiased=False)
    assert advantages[mask.bool()].tolist() == pytest.approx(whitened.tolist(), abs=1e-6)
    assert advantages[~mask.bool()].eq(0).all()


def test_sequence_reward_lands_on_last_live_token_for_reinforce_pp():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    other = torch.tensor([[1.0, 0.0, 0.0]])
    advantages, _ = _adv(
        "reinforce_pp", torch.tensor([2.0, 0.0]), torch.cat([mask, other]), torch.tensor([0, 1])
    )
    # returns on live tokens: 2, 2 (row 0) and 0 (row 1): mean 4/3, population std sqrt(8/9)
    s = math.sqrt(8 / 9)
    expected = torch.tensor([[(2 - 4 / 3) / s, (2 - 4 / 3) / s, 0.0], [-(4 / 3) / s, 0.0, 0.0]])
    assert torch.allclose(advantages, expected, atol=1e-6)


def test_gae_by_hand_skips_masked_tokens():
    rewards = torch.tensor([[0.0, float("nan"), 1.0]])
    values = torch.tensor([[0.5, 99.0, 0.8]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    advantages, _ = _adv("gae", rewards, mask, torch.tensor([0]), values, gamma=0.9, lambd=0.5)
    # t=2: 1 - 0.8 = 0.2; t=0: 0 + 0.9 * 0.8 - 0.5 + 0.45 * 0.2 = 0.31
    assert torch.allclose(advantages, torch.tensor([[0.31, 0.0, 0.2]]))


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        _adv("gae")


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_all_equal_rewards_give_zero(name):
    advantages, _ = _adv(name, torch.full((5,), 3.0))
    assert advantages.eq(0).all()


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_group_of_one_gives_zero(name):
    advantages, _ = _adv(name, torch.tensor([4.0]), torch.ones(1, 3), torch.tensor([3]))
    assert advantages.eq(0).all()


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_dead_trajectories_do_not_count_in_group_stats(name):
    mask = torch.ones(3, 2)
    mask[2] = 0
    advantages, _ = _adv(name, torch.tensor([1.0, 0.0, 100.0]), mask, torch.tensor([0, 0, 0]))
    reference, _ = _adv(name, torch.tensor([1.0, 0.0]), torch.ones(2, 2), torch.tensor([0, 0]))
    assert torch.allclose(advantages[:2], reference)
    assert advantages[2].eq(0).all()


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_masked_garbage_changes_nothing(name):
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 2.0]])
    values = torch.tensor([[0.1, 0.2, 0.0], [0.3, 0.0, 0.0], [0.4, 0.5, 0.6]])
    groups = torch.tensor([0, 0, 1])
    clean, _ = _adv(name, rewards, mask, groups, values)
    dirty_r, dirty_v = rewards.clone(), values.clone()
    dirty_r[mask == 0] = float("nan")
    dirty_v[mask == 0] = 1e30
    dirty, _ = _adv(name, dirty_r, mask, groups, dirty_v)
    assert torch.equal(clean, dirty)
    assert clean[mask == 0].eq(0).all()


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_bad_inputs_raise(name):
    values = torch.zeros(5, 3)
    with pytest.raises(ValueError, match="rewards"):
        _adv(name, REWARDS[:4], values=values)
    with pytest.raises(ValueError, match="rewards: non-finite"):
        _adv(name, torch.tensor([1.0, float("inf"), 0, 0, 0]), values=values)
    with pytest.raises(ValueError, match="group_ids"):
        _adv(name, groups=GROUPS.float(), values=values)
    with pytest.raises(ValueError, match="loss_mask"):
        _adv(name, mask=torch.ones(5), values=values)
