"""Truncated importance sampling: weight the loss by the capped train/rollout ratio (detached).

Each function takes the per-token log ratio from :func:`correction.ratio.compute_log_ratio`, the
loss mask and the :class:`~correction.config.CorrectionConfig`, and returns ``(weights, metrics)``
with weights broadcastable to ``[batch, response_len]`` (1 at masked positions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import check_like, fraction, live_mask, masked_stats, zero_dead
from correction.registry import Registry

if TYPE_CHECKING:
    from correction.config import CorrectionConfig

TIS_RATIO_TYPES: Registry = Registry("tis_ratio_type")


def _log_ratio(log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    live = live_mask(loss_mask)
    check_like(live, log_ratio=log_ratio)
    return zero_dead(log_ratio.detach(), live), live


@TIS_RATIO_TYPES.register("token")
def token_tis(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token weight min(r, C); ``[batch, response_len]``."""
    log_ratio, live = _log_ratio(log_ratio, loss_mask)
    ratio = log_ratio.clamp(-config.log_ratio_clamp, config.log_ratio_clamp).exp()
    cap = config.token_tis_ratio_clip_high
    metrics = {"correction/tis_token_clip_high_ratio": fraction(ratio > cap, live)}
    return ratio.clamp(max=cap), metrics


@TIS_RATIO_TYPES.register("sequence")
def sequence_tis(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sequence weight min(prod r, C_seq) over live tokens; ``[batch, 1]``."""
    log_ratio, live = _log_ratio(log_ratio, loss_mask)
    limit = config.log_ratio_clamp
    seq_ratio = log_ratio.sum(-1, keepdim=True).clamp(-limit, limit).exp()
    cap = config.sequence_tis_ratio_clip_high
    seq_live = live.any(-1, keepdim=True)
    metrics = masked_stats("correction/tis_seq_ratio", seq_ratio, seq_live)
    metrics["correction/tis_seq_clip_high_ratio"] = fraction(seq_ratio > cap, seq_live)
    return seq_ratio.clamp(max=cap), metrics
