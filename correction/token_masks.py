"""Token-ratio masks: zero divergent tokens (IcePop) or reject sequences holding one (outliers).

Both take the per-token log ratio, the loss mask and the correction config, and return
``(keep, metrics)`` with ``keep`` a bool tensor broadcastable to ``[batch, response_len]``.
A bound left as None is open.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from correction.flags import above, as_float, below, count, rows_any
from correction.ratio import Metrics, checked, share

if TYPE_CHECKING:
    from correction.config import CorrectionConfig


@checked
def token_mask(
    log_ratio: torch.Tensor, live: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, Metrics]:
    """Keep a token iff ``1 - token_mask_eps_low <= r <= 1 + token_mask_eps_high``; ``[B, T]``."""
    low = None if config.token_mask_eps_low is None else 1 - config.token_mask_eps_low
    high = None if config.token_mask_eps_high is None else 1 + config.token_mask_eps_high
    over, under = _outside(log_ratio, live, low, high)
    dropped = over | under
    total = count(live)
    metrics = {
        "correction/token_mask_ratio": share(dropped, total),
        "correction/token_mask_over_high_ratio": share(over, total),
        "correction/token_mask_under_low_ratio": share(under, total),
    }
    return ~dropped, metrics


@checked
def outlier_mask(
    log_ratio: torch.Tensor, live: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, Metrics]:
    """Keep a sequence iff every live token's r lies in the outlier bounds; ``[B, 1]``."""
    low, high = config.outlier_token_is_threshold_low, config.outlier_token_is_threshold_high
    log_low = -math.inf if low is None else math.log(low)
    log_high = math.inf if high is None else math.log(high)
    row_min, row_max = _live_row_extrema(log_ratio, live, min(max(0.0, log_low), log_high))
    seq_over = row_max > log_high
    seq_under = row_min < log_low
    dropped = seq_over | seq_under
    total = count(rows_any(live))
    metrics = {
        "correction/outlier_seq_masked_ratio": share(dropped, total),
        "correction/outlier_seq_over_high_ratio": share(seq_over, total),
        "correction/outlier_seq_under_low_ratio": share(seq_under, total),
    }
    return ~dropped, metrics


def _live_row_extrema(
    log_ratio: torch.Tensor, live: torch.Tensor, inside: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise min and max of ``log_ratio`` with masked positions reading ``inside``, a log ratio
    both bounds accept, so that they never trip one. One pass per extremum instead of a comparison
    per bound and token. Bounds around r = 1 accept 0, which a mask multiply writes exactly
    (``log_ratio`` is finite); others need ``torch.where``, >10x slower on CPU.
    """
    if inside == 0:
        values = as_float(live, log_ratio.dtype).mul_(log_ratio)
    else:
        values = torch.where(live, log_ratio, inside)
    return values.amin(-1, keepdim=True), values.amax(-1, keepdim=True)


def _outside(
    log_ratio: torch.Tensor, live: torch.Tensor, low: float | None, high: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Live positions above ``high`` and below ``low`` (compared in log space)."""
    none = torch.zeros((), dtype=torch.bool, device=live.device).expand(live.shape)
    over = above(log_ratio, math.log(high)) & live if high is not None else none
    under = below(log_ratio, math.log(low)) & live if low is not None else none
    return over, under
