"""Covariance-based entropy control (arXiv 2505.22617): Clip-Cov and KL-Cov.

Both rank live tokens by the centred covariance ``(A - mean A) * (log pi - mean log pi)``,
the quantity that drives entropy collapse, and restrain the few tokens where it is largest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import fraction, masked_mean, zero_dead
from megatron_rl.algorithms.policy_losses.common import (
    LOG_RATIO_CLAMP,
    LossInputs,
    clipped_surrogate,
    prepare,
)
from megatron_rl.algorithms.registry import POLICY_LOSSES

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import AlgorithmConfig

Result = tuple[torch.Tensor, dict[str, torch.Tensor]]


def _covariance(x: LossInputs) -> torch.Tensor:
    log_probs = x.log_probs.detach()
    centred_adv = x.advantages - masked_mean(x.advantages, x.live)
    return zero_dead(centred_adv * (log_probs - masked_mean(log_probs, x.live)), x.live)


@POLICY_LOSSES.register("clip_cov")
def clip_cov(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> Result:
    """PPO clip, plus: among unclipped tokens with covariance in ``(clip_cov_lb, clip_cov_ub)``,
    a random ``clip_ratio`` fraction of live tokens (at least one) lose their gradient (loss 0).
    """
    x = prepare(log_probs, old_log_probs, advantages, loss_mask)
    loss, metrics = clipped_surrogate(
        x.log_probs - x.old_log_probs, x, config.eps_clip_low, config.eps_clip_high
    )
    cfg = config.clip_cov
    ratio = (x.log_probs - x.old_log_probs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    in_range = (ratio >= 1 - config.eps_clip_low) & (ratio <= 1 + config.eps_clip_high)
    cov = _covariance(x)
    candidates = x.live & in_range & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    chosen = _random_subset(candidates, max(int(cfg.clip_ratio * int(x.live.sum())), 1))
    metrics["policy/clip_cov_ratio"] = fraction(chosen, x.live)
    return torch.where(chosen, 0.0, loss), metrics


@POLICY_LOSSES.register("kl_cov")
def kl_cov(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> Result:
    """Unclipped ``-A r``, plus ``ppo_kl_coef * |log r|`` on the top ``kl_cov_frac`` of live
    tokens by covariance (at least one).
    """
    x = prepare(log_probs, old_log_probs, advantages, loss_mask)
    log_ratio = (x.log_probs - x.old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss = -x.advantages * log_ratio.exp()
    cfg = config.kl_cov
    live_count = int(x.live.sum())
    k = min(max(int(cfg.kl_cov_frac * live_count), 1), live_count)
    cov = torch.where(x.live, _covariance(x), -torch.inf).reshape(-1)
    chosen = torch.zeros_like(cov, dtype=torch.bool)
    chosen[cov.topk(k).indices] = True
    chosen = chosen.reshape(x.live.shape)
    loss = torch.where(chosen, loss + cfg.ppo_kl_coef * log_ratio.abs(), loss)
    return zero_dead(loss, x.live), {"policy/kl_cov_ratio": fraction(chosen, x.live)}


def _random_subset(candidates: torch.Tensor, limit: int) -> torch.Tensor:
    """At most ``limit`` of the True positions of ``candidates``, picked uniformly at random."""
    flat = candidates.reshape(-1)
    positions = flat.nonzero().squeeze(-1)
    picked = positions[torch.randperm(positions.numel(), device=positions.device)[:limit]]
    chosen = torch.zeros_like(flat)
    chosen[picked] = True
    return chosen.reshape(candidates.shape)
