"""Overlong responses (DAPO): mask truncated ones out of the loss, or penalise length softly."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import check_per_sequence, fraction, live_mask

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import FilterConfig


def overlong_filter(
    loss_mask: torch.Tensor, truncated: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss mask with every token of a truncated response (``truncated [B]`` bool) zeroed."""
    live = live_mask(loss_mask)
    check_per_sequence(live.shape[0], truncated=truncated)
    cut = truncated.to(torch.bool)
    return live & ~cut.unsqueeze(-1), {"reward/overlong_filtered_ratio": fraction(cut, live.any(-1))}


def soft_overlong_penalty(
    response_lengths: torch.Tensor, config: FilterConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward penalty ``[B]``: 0 up to ``max - buffer`` tokens, then linear down to
    ``-overlong_penalty_factor`` at ``max_response_length``, and that value beyond.
    """
    if not isinstance(response_lengths, torch.Tensor) or response_lengths.dim() != 1:
        raise ValueError("response_lengths: expected a [batch] tensor")
    check_per_sequence(response_lengths.shape[0], response_lengths=response_lengths)
    buffer, limit = config.overlong_buffer_len, config.max_response_length
    if not buffer or limit is None:
        raise ValueError("soft overlong penalty needs overlong_buffer_len > 0 and max_response_length")
    excess = (response_lengths.to(torch.float32) - (limit - buffer)).clamp(min=0, max=buffer)
    penalty = -config.overlong_penalty_factor * excess / buffer
    return penalty, {"reward/overlong_penalty_mean": penalty.mean() if penalty.numel() else penalty.sum()}
