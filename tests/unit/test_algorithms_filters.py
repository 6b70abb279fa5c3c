"""Zero-variance and dynamic-sampling group filters, overlong filtering and the soft penalty."""

import pytest
import torch

from megatron_rl.algorithms.config import FilterConfig
from megatron_rl.algorithms.filters import dynamic_sampling, zero_variance_filter
from megatron_rl.algorithms.overlong import overlong_filter, soft_overlong_penalty


def test_zero_variance_groups_are_dropped():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 7.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    keep, m = zero_variance_filter(rewards, groups, torch.ones(7, 2), 1e-6)
    assert keep.tolist() == [True] * 4 + [False] * 3  # group 2 is alone: no signal either
    assert m["reward/zero_variance_group_ratio"].item() == pytest.approx(2 / 3)


def test_zero_variance_counts_only_live_trajectories_and_uses_tolerance():
    mask = torch.ones(4, 2)
    mask[1] = 0  # dead: its reward 0 must not create variance
    keep, _ = zero_variance_filter(
        torch.tensor([1.0, 0.0, 3.0, 3.0 + 1e-7]), torch.tensor([0, 0, 1, 1]), mask, 1e-6
    )
    assert keep.tolist() == [False, False, False, False]


def test_dynamic_sampling_filter_and_replace():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # group 1 has no variance; 3 is an extra
    mask = torch.ones(8, 2)
    keep, _ = dynamic_sampling(rewards, groups, mask, FilterConfig(dynamic_sampling_type="filter"))
    assert keep.tolist() == [True, True, False, False, True, True, True, True]
    cfg = FilterConfig(dynamic_sampling_type="replace", dynamic_sampling_target_groups=2)
    keep, m = dynamic_sampling(rewards, groups, mask, cfg)
    assert keep.tolist() == [True, True, False, False, True, True, False, False]
    assert m["reward/dynamic_sampling_missing_groups"].item() == 0
    cfg = FilterConfig(dynamic_sampling_type="replace", dynamic_sampling_target_groups=4)
    keep, m = dynamic_sampling(rewards, groups, mask, cfg)
    assert m["reward/dynamic_sampling_missing_groups"].item() == 1


def test_overlong_filter_masks_truncated_responses():
    mask, m = overlong_filter(torch.ones(2, 3), torch.tensor([True, False]))
    assert mask.tolist() == [[False] * 3, [True] * 3]
    assert m["reward/overlong_filtered_ratio"].item() == 0.5


def test_soft_overlong_penalty_ramp():
    cfg = FilterConfig(overlong_buffer_len=4, max_response_length=10, overlong_penalty_factor=1.0)
    penalty, _ = soft_overlong_penalty(torch.tensor([3, 6, 7, 10, 12]), cfg)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.25, -1.0, -1.0])


def test_filter_input_errors():
    with pytest.raises(ValueError, match="group_ids"):
        zero_variance_filter(torch.zeros(3), torch.zeros(2, dtype=torch.long), torch.ones(3, 2), 0.0)
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        soft_overlong_penalty(torch.tensor([3]), FilterConfig())
