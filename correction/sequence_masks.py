"""Sequence masks: drop whole sequences whose train/rollout ratio leaves ``[low, high]``.

Each function takes the per-token log ratio, the loss mask and the correction config, and returns
``(keep, metrics)`` with ``keep`` a ``[batch, 1]`` bool tensor. Sequences with no live token are
kept (there is nothing to drop) and not counted in the fractions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from correction.flags import as_float, count, rows_any
from correction.masked import masked_stats
from correction.ratio import Metrics, checked, share
from correction.registry import Registry

if TYPE_CHECKING:
    from correction.config import CorrectionConfig

SEQUENCE_MASK_METRICS: Registry = Registry("sequence_mask_metric")


@SEQUENCE_MASK_METRICS.register("geometric")
@checked
def geometric_sequence_mask(
    log_ratio: torch.Tensor, live: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, Metrics]:
    """Keep a sequence iff ``geo_mask_low <= exp(mean log r) <= geo_mask_high``."""
    mean_log = _live_sum(log_ratio, live) / count(live, dim=-1).clamp(min=1)
    return _bounded("geo_sequence_mask", mean_log, live, config.geo_mask_low, config.geo_mask_high, config)


@SEQUENCE_MASK_METRICS.register("product")
@checked
def product_sequence_mask(
    log_ratio: torch.Tensor, live: torch.Tensor, config: CorrectionConfig
) -> tuple[torch.Tensor, Metrics]:
    """Keep a sequence iff ``product_mask_low <= prod r <= product_mask_high``."""
    return _bounded(
        "product_sequence_mask",
        _live_sum(log_ratio, live),
        live,
        config.product_mask_low,
        config.product_mask_high,
        config,
    )


def _live_sum(log_ratio: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Per-sequence sum of live log ratios (masked positions may be live-dropped, not only 0). The
    log ratio is finite everywhere (checked and clamped), so multiplying by the mask is exact."""
    return as_float(live, log_ratio.dtype).mul_(log_ratio).sum(-1, keepdim=True)


def _bounded(
    name: str,
    seq_log_ratio: torch.Tensor,
    live: torch.Tensor,
    low: float,
    high: float,
    config: CorrectionConfig,
) -> tuple[torch.Tensor, Metrics]:
    """Compare in log space, so a product of thousands of ratios never overflows."""
    seq_live = rows_any(live)
    over = (seq_log_ratio > math.log(high)) & seq_live
    under = (seq_log_ratio < math.log(low)) & seq_live
    dropped = over | under
    total = count(seq_live)
    limit = config.log_ratio_clamp
    metrics = masked_stats(f"correction/{name}_ratio", seq_log_ratio.clamp(-limit, limit).exp(), seq_live)
    metrics[f"correction/{name}_masked_ratio"] = share(dropped, total)
    metrics[f"correction/{name}_over_high_ratio"] = share(over, total)
    metrics[f"correction/{name}_under_low_ratio"] = share(under, total)
    return ~dropped, metrics
