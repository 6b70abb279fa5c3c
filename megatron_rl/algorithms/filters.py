"""Group filters: drop groups whose rewards carry no signal (zero variance), DAPO dynamic sampling.

Each returns ``(keep [B] bool, metrics)``. Only live trajectories (a non-zero loss mask) count;
dead trajectories are never kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import live_mask
from megatron_rl.algorithms.groups import (
    check_group_ids,
    check_rewards,
    group_centred,
    sequence_scores,
)

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import FilterConfig


def zero_variance_filter(
    rewards: torch.Tensor, group_ids: torch.Tensor, loss_mask: torch.Tensor, tolerance: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Keep trajectories of groups whose live scores have std > ``tolerance`` (a lone one has 0)."""
    live = live_mask(loss_mask)
    check_rewards(rewards, live)
    check_group_ids(group_ids, live.shape[0])
    seq_live = live.any(-1)
    _, std, _ = group_centred(sequence_scores(rewards, live), group_ids, seq_live)
    keep = seq_live & (std > tolerance)
    groups = torch.unique(group_ids)
    kept = torch.unique(group_ids[keep])
    metrics = {
        "reward/zero_variance_group_ratio": torch.tensor(
            1 - kept.numel() / max(groups.numel(), 1), dtype=torch.float32
        )
    }
    return keep, metrics


def dynamic_sampling(
    rewards: torch.Tensor, group_ids: torch.Tensor, loss_mask: torch.Tensor, config: FilterConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DAPO dynamic sampling over a batch plus any extra groups sampled after it.

    ``filter``: keep every group with reward variance (the batch shrinks).
    ``replace``: keep the first ``dynamic_sampling_target_groups`` such groups in batch order, so
    zero-variance groups are replaced by extra groups appended at the end. The metric
    ``reward/dynamic_sampling_missing_groups`` says how many more groups the sampler still owes.
    """
    keep, metrics = zero_variance_filter(rewards, group_ids, loss_mask, config.zero_variance_tol)
    target = config.dynamic_sampling_target_groups
    if config.dynamic_sampling_type == "replace":
        keep, found = _first_groups(keep, group_ids, target)
        metrics["reward/dynamic_sampling_missing_groups"] = torch.tensor(float(target - found))
    return keep, metrics


def _first_groups(keep: torch.Tensor, group_ids: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
    """Restrict ``keep`` to the first ``limit`` kept groups, ordered by first appearance."""
    chosen: list[int] = []
    for gid in group_ids[keep].tolist():
        if gid not in chosen and len(chosen) < limit:
            chosen.append(gid)
    in_chosen = torch.isin(group_ids, torch.tensor(chosen, dtype=group_ids.dtype))
    return keep & in_chosen, len(chosen)
