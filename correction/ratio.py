"""The train-vs-rollout importance ratio every correction starts from.

``log r = train_old_logprob - rollout_logprob`` per token, clamped to ``[-clamp, clamp]`` in log
space so that ``exp`` never overflows, and exactly 0 (r = 1) at masked positions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from correction.masked import check_like, check_shape, count, live_mask, zero_dead

Metrics = dict[str, torch.Tensor]


def compute_log_ratio(
    train_old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    clamp: float = 20.0,
) -> tuple[torch.Tensor, Metrics]:
    """Clamped per-token log ratio (0 where masked) and the rollout-vs-train metrics.

    Metrics: ``correction/is_ratio_{mean,std,min,max}`` over live tokens (population std) and
    ``correction/logprob_abs_diff_{mean,max}``, the absolute rollout-vs-train log-prob gap.
    """
    live = live_mask(loss_mask)
    inputs = {"train_old_logprobs": train_old_logprobs, "rollout_logprobs": rollout_logprobs}
    check_shape(live, **inputs)
    if not clamp > 0:
        raise ValueError(f"log-ratio clamp must be > 0, got {clamp}")
    diff = zero_dead(train_old_logprobs.detach() - rollout_logprobs.detach(), live)
    gap = diff.abs()
    gap_sum = gap.sum()
    # A finite sum proves every entry finite (one reduction, not an isfinite pass over the batch);
    # a non-finite one is checked entry by entry, then the culprit is named.
    if not bool(torch.isfinite(gap_sum)) and not bool(torch.isfinite(diff).all()):
        check_like(live, **inputs)
        raise ValueError("train_old_logprobs - rollout_logprobs overflows at unmasked positions")
    log_ratio = diff.clamp(-clamp, clamp)
    return log_ratio, _metrics(gap, gap_sum, log_ratio.exp(), live)


def _metrics(gap: torch.Tensor, gap_sum: torch.Tensor, ratio: torch.Tensor, live: torch.Tensor) -> Metrics:
    """Live-token stats: masked positions hold diff 0 and ratio exactly 1, so the mean is corrected by
    the dead count and min/max need a masked pass only when 1 wins. The variance sums live deviations
    only: subtracting the dead tokens' share from a sum over all positions cancels catastrophically
    when they dominate (one live token among six gave std 7e-4 instead of 0).
    """
    live_count = int(count(live))
    if live_count == 0:
        zero = ratio.new_zeros(())
        names = ("is_ratio_mean", "is_ratio_std", "is_ratio_min", "is_ratio_max")
        return {f"correction/{k}": zero for k in names + ("logprob_abs_diff_mean", "logprob_abs_diff_max")}
    dead, n = live.numel() - live_count, live_count
    mean = (ratio.sum() - dead) / n
    centred = (ratio - mean) * live  # ratio is finite everywhere, so the mask multiplies exactly
    var = (centred * centred).sum() / n
    low, high = torch.aminmax(ratio)
    if dead:
        if not bool(low < 1):
            low = torch.where(live, ratio, torch.inf).min()
        if not bool(high > 1):
            high = torch.where(live, ratio, -torch.inf).max()
    return {
        "correction/is_ratio_mean": mean,
        "correction/is_ratio_std": var.sqrt(),
        "correction/is_ratio_min": low,
        "correction/is_ratio_max": high,
        "correction/logprob_abs_diff_mean": gap_sum / n,
        "correction/logprob_abs_diff_max": gap.max(),
    }


Core = Callable[[torch.Tensor, torch.Tensor, "object"], tuple[torch.Tensor, Metrics]]


def checked(core: Core) -> Core:
    """Public form of a correction ``core(log_ratio, live, config)``.

    The public form takes any log ratio and loss mask, validates them and zeroes masked positions;
    :func:`correction.apply.apply_correction`, which has done that once already, calls
    ``fn.unchecked`` (the core) directly.
    """

    @functools.wraps(core)
    def public(log_ratio: torch.Tensor, loss_mask: torch.Tensor, config) -> tuple[torch.Tensor, Metrics]:
        live = live_mask(loss_mask)
        check_like(live, log_ratio=log_ratio)
        return core(zero_dead(log_ratio.detach(), live), live, config)

    public.unchecked = core
    return public


def share(flags: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``count(flags) / total`` as a float32 0-d tensor (0 when count is 0); flags must be live-only."""
    return (count(flags) / total.clamp(min=1)).to(torch.float32)
