"""The train-vs-rollout importance ratio every correction starts from.

``log r = train_old_logprob - rollout_logprob`` per token, clamped to ``[-clamp, clamp]`` in log
space so that ``exp`` never overflows, and exactly 0 (r = 1) at masked positions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from correction.flags import as_float, count
from correction.masked import check_like, check_shape, live_mask, zero_dead

Metrics = dict[str, torch.Tensor]

_METRIC_NAMES = (
    "correction/is_ratio_mean",
    "correction/is_ratio_std",
    "correction/is_ratio_min",
    "correction/is_ratio_max",
    "correction/logprob_abs_diff_mean",
    "correction/logprob_abs_diff_max",
)


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
    live_float = as_float(live, torch.result_type(train_old_logprobs, rollout_logprobs))
    diff = _live_diff(inputs, live, live_float)
    live_count = int(count(live))
    if live_count == 0:
        return diff.clamp_(-clamp, clamp), dict.fromkeys(_METRIC_NAMES, diff.new_zeros(()))
    gap_metrics = _gap_metrics(diff, live_count)
    log_ratio = diff.clamp_(-clamp, clamp)
    return log_ratio, {**_ratio_metrics(log_ratio, live, live_float, live_count), **gap_metrics}


def _live_diff(
    inputs: dict[str, torch.Tensor], live: torch.Tensor, live_float: torch.Tensor
) -> torch.Tensor:
    """``train_old - rollout``, exactly 0 where masked; ``ValueError`` unless finite where live.

    Multiplying by the 0/1 mask is exact for finite entries and >10x cheaper than ``torch.where`` on
    CPU, and a finite sum proves every entry finite (one reduction, not an isfinite pass over the
    batch). Garbage at masked positions (nan, inf) turns the product into nan: only then are the
    inputs checked entry by entry (naming the culprit) and the masked positions selected exactly.
    """
    old, rollout = (value.detach() for value in inputs.values())
    diff = (old - rollout).mul_(live_float)
    if bool(torch.isfinite(diff.sum())):
        return diff
    check_like(live, **inputs)
    diff = zero_dead(old - rollout, live)
    if not bool(torch.isfinite(diff).all()):
        raise ValueError("train_old_logprobs - rollout_logprobs overflows at unmasked positions")
    return diff


def _gap_metrics(diff: torch.Tensor, live_count: int) -> Metrics:
    """Mean and max of the live ``|train_old - rollout|`` (masked positions hold 0)."""
    gap = diff.abs()
    return {
        "correction/logprob_abs_diff_mean": gap.sum() / live_count,
        "correction/logprob_abs_diff_max": gap.max(),
    }


def _ratio_metrics(
    log_ratio: torch.Tensor, live: torch.Tensor, live_float: torch.Tensor, live_count: int
) -> Metrics:
    """Live-token stats of r: masked positions hold r exactly 1, so the mean is corrected by the
    dead count and min/max need a masked pass only when 1 wins. The variance sums live deviations
    only: subtracting the dead tokens' share from a sum over all positions cancels catastrophically
    when they dominate (one live token among six gave std 7e-4 instead of 0).
    """
    ratio = log_ratio.exp()
    dead = live.numel() - live_count
    low, high = torch.aminmax(ratio)
    if dead:
        if not bool(low < 1):
            low = torch.where(live, ratio, torch.inf).min()
        if not bool(high > 1):
            high = torch.where(live, ratio, -torch.inf).max()
    mean = (ratio.sum() - dead) / live_count
    # In place on our own exp: each fresh batch-sized buffer costs page faults on CPU. The ratio is
    # finite everywhere, so the mask multiplies exactly.
    var = ratio.sub_(mean).mul_(live_float).square_().sum() / live_count
    return {
        "correction/is_ratio_mean": mean,
        "correction/is_ratio_std": var.sqrt(),
        "correction/is_ratio_min": low,
        "correction/is_ratio_max": high,
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
