"""The one entry point: every configured correction, in a fixed and documented order.

Order (as in SkyRL, so the same config means the same thing):

1. outlier rejection: drop sequences holding any token ratio outside the outlier bounds;
2. token mask (IcePop): zero the remaining tokens whose ratio leaves ``[1 - eps_low, 1 + eps_high]``;
3. TIS: capped ratio weights, computed over the tokens that survived 1 and 2;
4. sequence mask (geometric or product), also over the surviving tokens.

Each step sees the mask left by the steps before it. The result is a loss weight (multiply the
per-token loss by it; detached) and the corrected loss mask (aggregate the loss with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from correction.config import CorrectionConfig
from correction.flags import count, narrow
from correction.masked import live_mask
from correction.ratio import compute_log_ratio, share
from correction.sequence_masks import SEQUENCE_MASK_METRICS
from correction.tis import TIS_RATIO_TYPES
from correction.token_masks import outlier_mask, token_mask


@dataclass
class Correction:
    """What the loss needs from the corrections."""

    weights: torch.Tensor
    """Detached loss weights, broadcastable to ``[batch, response_len]`` (all ones without TIS)."""
    loss_mask: torch.Tensor
    """Bool ``[batch, response_len]``: the input mask minus every masked token or sequence."""


def apply_correction(
    train_old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: CorrectionConfig,
) -> tuple[Correction, dict[str, torch.Tensor]]:
    """Run the configured corrections; with none configured, the identity and no metrics."""
    live = live_mask(loss_mask)
    ones = torch.ones((live.shape[0], 1), dtype=train_old_logprobs.dtype, device=live.device)
    if not config.enabled:
        return Correction(weights=ones, loss_mask=live), {}
    log_ratio, metrics = compute_log_ratio(
        train_old_logprobs, rollout_logprobs, live, config.log_ratio_clamp
    )
    total = count(live)
    if config.outlier_enabled:
        live = _narrow(live, _core(outlier_mask)(log_ratio, live, config), metrics)
    if config.token_mask_enabled:
        live = _narrow(live, _core(token_mask)(log_ratio, live, config), metrics)
    weights = ones
    if config.tis_ratio_type is not None:
        tis = _core(TIS_RATIO_TYPES.get(config.tis_ratio_type))
        weights, tis_metrics = tis(log_ratio, live, config)
        metrics.update(tis_metrics)
    if config.sequence_mask_metric is not None:
        mask_fn = _core(SEQUENCE_MASK_METRICS.get(config.sequence_mask_metric))
        live = _narrow(live, mask_fn(log_ratio, live, config), metrics)
    metrics["correction/loss_mask_kept_ratio"] = share(live, total)
    return Correction(weights=weights, loss_mask=live), metrics


def _core(fn):
    """Skip re-validation for built-ins (inputs were checked once above); user functions run as given."""
    return getattr(fn, "unchecked", fn)


def _narrow(
    live: torch.Tensor,
    step: tuple[torch.Tensor, dict[str, torch.Tensor]],
    metrics: dict[str, torch.Tensor],
) -> torch.Tensor:
    keep, step_metrics = step
    metrics.update(step_metrics)
    return narrow(live, keep)
