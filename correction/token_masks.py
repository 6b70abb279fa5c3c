"""Token-ratio masks: zero divergent tokens (IcePop) or reject sequences holding one (outliers).

Both take the per-token log ratio, the loss mask and the correction config, and return
``(keep, metrics)`` with ``keep`` a bool tensor broadcastable to ``[batch, response_len]``.
A bound left as None is open.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from correction.masked import check_like, fraction, live_mask

if TYPE_CHECKING:
    from correction.config import CorrectionConfig


def token_mask(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Keep a token iff ``1 - token_mask_eps_low <= r <= 1 + token_mask_eps_high``; ``[B, T]``."""
    live = live_mask(loss_mask)
    check_like(live, log_ratio=log_ratio)
    low = None if config.token_mask_eps_low is None else 1 - config.token_mask_eps_low
    high = None if config.token_mask_eps_high is None else 1 + config.token_mask_eps_high
    over, under = _outside(log_ratio.detach(), live, low, high)
    keep = ~(over | under)
    metrics = {
        "correction/token_mask_ratio": fraction(~keep, live),
        "correction/token_mask_over_high_ratio": fraction(over, live),
        "correction/token_mask_under_low_ratio": fraction(under, live),
    }
    return keep, metrics


def outlier_mask(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Keep a sequence iff every live token's r lies in the outlier bounds; ``[B, 1]``."""
    live = live_mask(loss_mask)
    check_like(live, log_ratio=log_ratio)
    over, under = _outside(
        log_ratio.detach(),
        live,
        config.outlier_token_is_threshold_low,
        config.outlier_token_is_threshold_high,
    )
    seq_over = over.any(-1, keepdim=True)
    seq_under = under.any(-1, keepdim=True)
    keep = ~(seq_over | seq_under)
    seq_live = live.any(-1, keepdim=True)
    metrics = {
        "correction/outlier_seq_masked_ratio": fraction(~keep, seq_live),
        "correction/outlier_seq_over_high_ratio": fraction(seq_over, seq_live),
        "correction/outlier_seq_under_low_ratio": fraction(seq_under, seq_live),
    }
    return keep, metrics


def _outside(
    log_ratio: torch.Tensor, live: torch.Tensor, low: float | None, high: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Live positions above ``high`` and below ``low`` (compared in log space)."""
    none = torch.zeros_like(live)
    over = live & (log_ratio > math.log(high)) if high is not None else none
    under = live & (log_ratio < math.log(low)) if low is not None else none
    return over, under
