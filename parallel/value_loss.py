"""PPO's clipped value loss, a pure tensor function (hand-checked in tests/unit/test_parallel_value_loss.py)."""

from __future__ import annotations

import torch


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``0.5 * max((v - R)^2, (v_old + clamp(v - v_old, -clip, clip) - R)^2)``, mean over masked tokens.

    ``clip=None`` is the unclipped squared error. Metrics: ``critic/clip_fraction`` (tokens where the
    clipped term is the larger), ``critic/value_mean``, ``critic/abs_error`` (mean |v - R|).
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"critic.value_clip: must be > 0 or null, got {clip}")
    mask = mask.to(values.dtype)
    live = mask.sum().clamp(min=1)
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token, clipped_share = unclipped, torch.zeros((), device=values.device)
    else:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (v_clipped - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clipped_share = ((clipped > unclipped).to(values.dtype) * mask).sum() / live
    loss = 0.5 * (per_token * mask).sum() / live
    metrics = {
        "critic/clip_fraction": clipped_share.detach(),
        "critic/value_mean": ((values.detach() * mask).sum() / live),
        "critic/abs_error": (((values.detach() - returns).abs() * mask).sum() / live),
    }
    return loss, metrics
