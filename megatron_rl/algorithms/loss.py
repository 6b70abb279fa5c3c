"""The whole policy update loss: correction, policy loss, aggregation, KL term, entropy bonus.

    correction (if configured) -> corrected mask and TIS weights
    policy loss per token      -> * TIS weights -> aggregate with the corrected mask
    + kl_loss_coef * KL        (if use_kl_loss; aggregated the same way)
    - entropy_coeff * entropy  (if token entropies are given)
"""

from __future__ import annotations

import torch

from correction.apply import apply_correction
from correction.masked import live_mask
from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.kl import token_kl
from megatron_rl.algorithms.registry import LOSS_AGGREGATIONS, POLICY_LOSSES


def policy_update_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: AlgorithmConfig,
    *,
    rollout_logprobs: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss to backpropagate, and its metrics (``policy/*``, ``correction/*``)."""
    live = live_mask(loss_mask)
    weights, metrics = None, {}
    if config.correction.enabled:
        if rollout_logprobs is None:
            raise ValueError("algorithm.correction is configured but rollout_logprobs were not given")
        corrected, metrics = apply_correction(old_log_probs, rollout_logprobs, live, config.correction)
        live, weights = corrected.loss_mask, corrected.weights
    loss_fn = POLICY_LOSSES.get(config.policy_loss_type)
    token_loss, loss_metrics = loss_fn(
        log_probs, old_log_probs, advantages, live, config, rollout_logprobs
    )
    metrics.update(loss_metrics)
    if weights is not None:
        token_loss = token_loss * weights
    aggregate = LOSS_AGGREGATIONS.get(config.loss_agg_mode)
    loss = aggregate(token_loss, live, config.loss_agg_norm_length)
    metrics["policy/pg_loss"] = loss.detach()
    if config.kl.use_kl_loss:
        if ref_log_probs is None:
            raise ValueError("algorithm.kl.use_kl_loss is set but ref_log_probs were not given")
        kl, kl_metrics = token_kl(log_probs, ref_log_probs, live, config.kl.kl_estimator_type)
        metrics.update(kl_metrics)
        loss = loss + config.kl.kl_loss_coef * aggregate(kl, live, config.loss_agg_norm_length)
    if entropy is not None:
        bonus = aggregate(entropy, live, config.loss_agg_norm_length)
        metrics["policy/entropy"] = bonus.detach()
        loss = loss - config.entropy_coeff * bonus
    metrics["policy/loss"] = loss.detach()
    return loss, metrics
