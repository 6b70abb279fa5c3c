"""PPO clip (DAPO clip-higher via separate low/high ranges), dual clip, and rollout IS."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import check_like, fraction
from megatron_rl.algorithms.policy_losses.common import clipped_surrogate, prepare
from megatron_rl.algorithms.registry import POLICY_LOSSES

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import AlgorithmConfig

Result = tuple[torch.Tensor, dict[str, torch.Tensor]]


@POLICY_LOSSES.register("regular")
def ppo_clip(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> Result:
    """PPO clipped surrogate, ratio ``pi / pi_old`` clipped to ``[1 - eps_clip_low, 1 + eps_clip_high]``."""
    x = prepare(log_probs, old_log_probs, advantages, loss_mask)
    return clipped_surrogate(
        x.log_probs - x.old_log_probs, x, config.eps_clip_low, config.eps_clip_high
    )


@POLICY_LOSSES.register("dual_clip")
def dual_clip(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> Result:
    """PPO clip, and for negative advantages the loss is also capped at ``-A * clip_ratio_c``."""
    x = prepare(log_probs, old_log_probs, advantages, loss_mask)
    loss, metrics = clipped_surrogate(
        x.log_probs - x.old_log_probs, x, config.eps_clip_low, config.eps_clip_high
    )
    cap = -x.advantages * config.clip_ratio_c
    capped = (x.advantages < 0) & (loss > cap)
    metrics["policy/dual_clip_ratio"] = fraction(capped.detach(), x.live)
    return torch.where(capped, cap, loss), metrics


@POLICY_LOSSES.register("rollout_is")
def rollout_is(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> Result:
    """PPO clip with the sampler as behaviour policy: ratio ``pi / pi_rollout`` (fully async).

    ``old_log_probs`` is not used: no old-log-prob forward pass is needed.
    """
    if rollout_logprobs is None:
        raise ValueError("policy loss 'rollout_is' needs rollout_logprobs")
    x = prepare(log_probs, rollout_logprobs, advantages, loss_mask)
    check_like(x.live, old_log_probs=old_log_probs)
    return clipped_surrogate(
        x.log_probs - x.old_log_probs, x, config.eps_clip_low, config.eps_clip_high
    )
