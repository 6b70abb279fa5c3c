"""KL to a reference policy: k1/k2/k3 estimators, as a reward penalty or as a loss term.

Estimators are elementwise on sampled tokens (J. Schulman, "Approximating KL divergence", 2020),
with ``log_ratio = log_probs - ref_log_probs``: k1 = log_ratio (unbiased, high variance),
k2 = log_ratio^2 / 2, k3 = exp(-log_ratio) + log_ratio - 1 (unbiased, low variance, >= 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import check_like, live_mask, masked_mean, zero_dead
from megatron_rl.algorithms.groups import check_rewards, token_rewards
from megatron_rl.algorithms.registry import KL_ESTIMATORS

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import KLConfig

_LOG_RATIO_CLAMP = 20.0
_K3_MAX = 10.0


@KL_ESTIMATORS.register("k1")
def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register("k2")
def k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_probs - ref_log_probs).square()


@KL_ESTIMATORS.register("k3")
def k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Clamped in log space and above, so a far-off token cannot blow up the loss."""
    neg = (ref_log_probs - log_probs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (neg.exp() - neg - 1).clamp(max=_K3_MAX)


def token_kl(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, loss_mask: torch.Tensor, estimator: str
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token KL estimate ``[B, T]`` (0 where masked) and ``policy/kl`` (its live-token mean)."""
    live = live_mask(loss_mask)
    check_like(live, log_probs=log_probs, ref_log_probs=ref_log_probs)
    kl = KL_ESTIMATORS.get(estimator)(zero_dead(log_probs, live), zero_dead(ref_log_probs.detach(), live))
    kl = zero_dead(kl, live)
    return kl, {"policy/kl": masked_mean(kl.detach(), live)}


def kl_penalty_rewards(
    rewards: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: KLConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token rewards ``[B, T]`` minus ``kl_reward_coef`` * KL (detached): KL as a reward penalty."""
    live = live_mask(loss_mask)
    check_rewards(rewards, live)
    kl, metrics = token_kl(log_probs.detach(), ref_log_probs, live, config.kl_estimator_type)
    penalised = token_rewards(rewards, live) - config.kl_reward_coef * kl
    return penalised, {"reward/kl_penalty": config.kl_reward_coef * metrics["policy/kl"]}
