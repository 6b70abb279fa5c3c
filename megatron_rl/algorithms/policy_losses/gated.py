"""Losses that keep every token's gradient but reshape it: CISPO (clipped IS weight) and SAPO (soft gate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import fraction, masked_mean, zero_dead
from megatron_rl.algorithms.policy_losses.common import LOG_RATIO_CLAMP, prepare
from megatron_rl.algorithms.registry import POLICY_LOSSES

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import AlgorithmConfig

Result = tuple[torch.Tensor, dict[str, torch.Tensor]]


@POLICY_LOSSES.register("cispo")
def cispo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> Result:
    """CISPO (arXiv 2506.13585): ``-sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * log pi``.

    Clipping the (detached) weight instead of the ratio keeps a gradient for clipped tokens.
    """
    x = prepare(log_probs, old_log_probs, advantages, loss_mask)
    ratio = (x.log_probs - x.old_log_probs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    weight = ratio.clamp(1 - config.eps_clip_low, 1 + config.eps_clip_high)
    loss = zero_dead(-x.advantages * weight * x.log_probs, x.live)
    clipped = (ratio < 1 - config.eps_clip_low) | (ratio > 1 + config.eps_clip_high)
    return loss, {"policy/cispo_clip_ratio": fraction(clipped, x.live)}


@POLICY_LOSSES.register("sapo")
def sapo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> Result:
    """SAPO (Soft Adaptive Policy Optimization, Qwen 2025): ``-A * sigmoid(tau (r - 1)) * 4 / tau``, a soft trust region.

    The gate's slope is 1 at r = 1 (the plain policy gradient) and decays smoothly away from it;
    ``tau`` is ``sapo.tau_pos`` for positive advantages and ``sapo.tau_neg`` otherwise.
    """
    x = prepare(log_probs, old_log_probs, advantages, loss_mask)
    ratio = (x.log_probs - x.old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    tau = torch.where(x.advantages > 0, config.sapo.tau_pos, config.sapo.tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    loss = zero_dead(-x.advantages * gate, x.live)
    slope = 4 * torch.sigmoid(tau * (ratio.detach() - 1)) * torch.sigmoid(-tau * (ratio.detach() - 1))
    return loss, {"policy/sapo_gate_slope_mean": masked_mean(slope, x.live)}
