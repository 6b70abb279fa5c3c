"""The train-vs-rollout importance ratio every correction starts from.

``log r = train_old_logprob - rollout_logprob`` per token, clamped to ``[-clamp, clamp]`` in log
space so that ``exp`` never overflows, and exactly 0 (r = 1) at masked positions.
"""

from __future__ import annotations

import torch

from correction.masked import check_like, live_mask, masked_mean, masked_stats, zero_dead


def compute_log_ratio(
    train_old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    clamp: float = 20.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clamped per-token log ratio (0 where masked) and the rollout-vs-train metrics.

    Metrics: ``correction/is_ratio_{mean,std,min,max}`` over live tokens and
    ``correction/logprob_abs_diff_{mean,max}``, the absolute rollout-vs-train log-prob gap.
    """
    live = live_mask(loss_mask)
    check_like(live, train_old_logprobs=train_old_logprobs, rollout_logprobs=rollout_logprobs)
    if not clamp > 0:
        raise ValueError(f"log-ratio clamp must be > 0, got {clamp}")
    diff = zero_dead(train_old_logprobs.detach() - rollout_logprobs.detach(), live)
    log_ratio = diff.clamp(-clamp, clamp)
    metrics = masked_stats("correction/is_ratio", log_ratio.exp(), live)
    gap = diff.abs()
    metrics["correction/logprob_abs_diff_mean"] = masked_mean(gap, live)
    metrics["correction/logprob_abs_diff_max"] = gap.max() if gap.numel() else gap.sum()
    return log_ratio, metrics
