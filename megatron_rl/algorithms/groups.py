"""Per-trajectory rewards and per-group statistics, for ragged groups given by ``group_ids``.

Only live trajectories (at least one unmasked token) count in a group's statistics.
"""

from __future__ import annotations

import torch

from correction.masked import check_like, check_per_sequence, zero_dead


def check_rewards(rewards: torch.Tensor, live: torch.Tensor) -> None:
    """Rewards are per sequence ``[B]`` or per token ``[B, T]``, finite where it matters."""
    if isinstance(rewards, torch.Tensor) and rewards.dim() == 2:
        check_like(live, rewards=rewards)
    else:
        check_per_sequence(live.shape[0], rewards=rewards)


def check_group_ids(group_ids: torch.Tensor, batch: int) -> None:
    check_per_sequence(batch, group_ids=group_ids)
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids: expected an integer tensor, got {group_ids.dtype}")


def sequence_scores(rewards: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """One score per trajectory: the reward itself, or the sum of its live token rewards."""
    if rewards.dim() == 1:
        return rewards.to(torch.float32 if not rewards.is_floating_point() else rewards.dtype)
    return zero_dead(rewards, live).sum(-1)


def token_rewards(rewards: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Rewards as ``[B, T]``: per-token as given (0 where masked), or the score on the last live token."""
    if rewards.dim() == 2:
        return zero_dead(rewards, live)
    positions = torch.arange(live.shape[1], device=live.device)
    last = torch.where(live, positions, -1).max(-1, keepdim=True).values
    placed = (positions == last) & live
    return torch.where(placed, rewards.to(torch.float32).unsqueeze(-1), 0.0)


def group_centred(
    scores: torch.Tensor, group_ids: torch.Tensor, seq_live: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per trajectory: score minus its group's mean, the group's unbiased std (0 for fewer than two)
    and the group's live count, ``[B]`` each; dead trajectories get 0 and count for nothing.

    Scores are first shifted by one live member of their group, so a group of equal scores centres
    to exactly 0 (no rounding noise for a std normalisation to blow up).
    """
    batch = scores.shape[0]
    index = torch.unique(group_ids, return_inverse=True)[1]
    groups = int(index.max()) + 1 if index.numel() else 0
    positions = torch.where(seq_live, torch.arange(batch, device=scores.device), batch)
    first = torch.full((groups,), batch, device=scores.device)
    first = first.scatter_reduce(0, index, positions, "amin").clamp(max=max(batch - 1, 0))
    shifted = zero_dead(scores - scores[first][index], seq_live)
    count = scores.new_zeros(groups).index_add_(0, index, seq_live.to(scores.dtype))
    mean = (scores.new_zeros(groups).index_add_(0, index, shifted) / count.clamp(min=1))[index]
    centred = zero_dead(shifted - mean, seq_live)
    var = scores.new_zeros(groups).index_add_(0, index, centred.square()) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), 0.0)[index]
    return centred, std, count[index]
