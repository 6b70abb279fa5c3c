"""Sequence masks: drop whole sequences whose train/rollout ratio leaves ``[low, high]``.

Each function takes the per-token log ratio, the loss mask and the correction config, and returns
``(keep, metrics)`` with ``keep`` a ``[batch, 1]`` bool tensor. Sequences with no live token are
kept (there is nothing to drop) and not counted in the fractions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from correction.masked import check_like, fraction, live_mask, masked_stats, zero_dead
from correction.registry import Registry

if TYPE_CHECKING:
    from correction.config import CorrectionConfig

SEQUENCE_MASK_METRICS: Registry = Registry("sequence_mask_metric")


@SEQUENCE_MASK_METRICS.register("geometric")
def geometric_sequence_mask(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Keep a sequence iff ``geo_mask_low <= exp(mean log r) <= geo_mask_high``."""
    live = live_mask(loss_mask)
    check_like(live, log_ratio=log_ratio)
    total = zero_dead(log_ratio.detach(), live).sum(-1, keepdim=True)
    mean_log = total / live.sum(-1, keepdim=True).clamp(min=1).to(total.dtype)
    return _bounded(
        "geo_sequence_mask", mean_log, live, config.geo_mask_low, config.geo_mask_high, config
    )


@SEQUENCE_MASK_METRICS.register("product")
def product_sequence_mask(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Keep a sequence iff ``product_mask_low <= prod r <= product_mask_high``."""
    live = live_mask(loss_mask)
    check_like(live, log_ratio=log_ratio)
    total = zero_dead(log_ratio.detach(), live).sum(-1, keepdim=True)
    return _bounded(
        "product_sequence_mask", total, live, config.product_mask_low, config.product_mask_high, config
    )


def _bounded(
    name: str,
    seq_log_ratio: torch.Tensor,
    live: torch.Tensor,
    low: float,
    high: float,
    config: CorrectionConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Compare in log space, so a product of thousands of ratios never overflows."""
    seq_live = live.any(-1, keepdim=True)
    over = seq_log_ratio > math.log(high)
    under = seq_log_ratio < math.log(low)
    keep = ~(over | under) | ~seq_live
    limit = config.log_ratio_clamp
    metrics = masked_stats(f"correction/{name}_ratio", seq_log_ratio.clamp(-limit, limit).exp(), seq_live)
    metrics[f"correction/{name}_masked_ratio"] = fraction(~keep, seq_live)
    metrics[f"correction/{name}_over_high_ratio"] = fraction(over, seq_live)
    metrics[f"correction/{name}_under_low_ratio"] = fraction(under, seq_live)
    return keep, metrics
