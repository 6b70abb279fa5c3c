"""Truncated importance sampling: weight the loss by the capped train/rollout ratio (detached).

Each function takes the per-token log ratio from :func:`correction.ratio.compute_log_ratio`, the
loss mask and the :class:`~correction.config.CorrectionConfig`, and returns ``(weights, metrics)``
with weights broadcastable to ``[batch, response_len]`` (1 at masked positions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.flags import above, count, rows_any
from correction.masked import masked_stats
from correction.ratio import Metrics, checked, share
from correction.registry import Registry

if TYPE_CHECKING:
    from correction.config import CorrectionConfig

TIS_RATIO_TYPES: Registry = Registry("tis_ratio_type")


@TIS_RATIO_TYPES.register("token")
@checked
def token_tis(
    log_ratio: torch.Tensor, live: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, Metrics]:
    """Per-token weight min(r, C); ``[batch, response_len]``."""
    cap = config.token_tis_ratio_clip_high
    ratio = log_ratio.exp()
    over = above(ratio, cap) & live
    metrics = {"correction/tis_token_clip_high_ratio": share(over, count(live))}
    return ratio.clamp_(max=cap), metrics


@TIS_RATIO_TYPES.register("sequence")
@checked
def sequence_tis(
    log_ratio: torch.Tensor, live: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, Metrics]:
    """Per-sequence weight min(prod r, C_seq) over live tokens; ``[batch, 1]``."""
    limit = config.log_ratio_clamp
    seq_ratio = torch.where(live, log_ratio, 0.0).sum(-1, keepdim=True).clamp(-limit, limit).exp()
    cap = config.sequence_tis_ratio_clip_high
    seq_live = rows_any(live)
    metrics = masked_stats("correction/tis_seq_ratio", seq_ratio, seq_live)
    metrics["correction/tis_seq_clip_high_ratio"] = share((seq_ratio > cap) & seq_live, count(seq_live))
    return seq_ratio.clamp(max=cap), metrics
