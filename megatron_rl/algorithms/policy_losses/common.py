"""Shared input handling and the clipped surrogate every PPO-style loss builds on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from correction.masked import check_like, fraction, live_mask, masked_mean, zero_dead

LOG_RATIO_CLAMP = 20.0


@dataclass
class LossInputs:
    """Validated inputs with masked positions zeroed (so no garbage reaches value or gradient)."""

    log_probs: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    live: torch.Tensor


def prepare(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
) -> LossInputs:
    live = live_mask(loss_mask)
    check_like(live, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    return LossInputs(
        log_probs=zero_dead(log_probs, live),
        old_log_probs=zero_dead(old_log_probs.detach(), live),
        advantages=zero_dead(advantages.detach(), live),
        live=live,
    )


def clipped_surrogate(
    log_ratio: torch.Tensor, x: LossInputs, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` per token, with clip metrics."""
    ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    unclipped = -x.advantages * ratio
    clipped = -x.advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = zero_dead(torch.maximum(unclipped, clipped), x.live)
    metrics = {
        "policy/ppo_clip_ratio": fraction(clipped.detach() > unclipped.detach(), x.live),
        "policy/ppo_kl": masked_mean(-log_ratio.detach(), x.live),
    }
    return loss, metrics
