"""Cross-entropy on the sampled tokens, for SFT warm starts from the same pipeline."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import masked_mean, zero_dead
from megatron_rl.algorithms.policy_losses.common import prepare
from megatron_rl.algorithms.registry import POLICY_LOSSES

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import AlgorithmConfig


@POLICY_LOSSES.register("cross_entropy")
def cross_entropy(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-log pi`` per token; advantages and old log-probs are validated but not used."""
    x = prepare(log_probs, old_log_probs, advantages, loss_mask)
    loss = zero_dead(-x.log_probs, x.live)
    return loss, {"policy/nll": masked_mean(loss.detach(), x.live)}
