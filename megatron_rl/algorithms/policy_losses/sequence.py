"""GSPO: one importance ratio per sequence (geometric mean of token ratios)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import masked_mean
from megatron_rl.algorithms.policy_losses.common import clipped_surrogate, prepare
from megatron_rl.algorithms.registry import POLICY_LOSSES

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import AlgorithmConfig


@POLICY_LOSSES.register("gspo")
def gspo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token (arXiv 2507.18071): ``s_i = exp(mean_t log(pi/pi_old))`` per sequence.

    Each token's ratio has the value of ``s_i`` and the gradient of its own log-prob:
    ``sg[s_i] * pi_t / sg[pi_t]``; then the usual clipped surrogate (GSPO uses small eps).
    """
    x = prepare(log_probs, old_log_probs, advantages, loss_mask)
    seq_log_ratio = masked_mean(x.log_probs - x.old_log_probs, x.live, dim=-1).unsqueeze(-1)
    token_log_ratio = x.log_probs - x.log_probs.detach() + seq_log_ratio.detach()
    return clipped_surrogate(token_log_ratio, x, config.eps_clip_low, config.eps_clip_high)
