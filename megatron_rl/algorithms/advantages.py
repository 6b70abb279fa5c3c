"""Outcome advantage estimators: GRPO, Dr.GRPO, RLOO, REINFORCE++ (with and without baseline).

Each takes ``rewards`` (``[B]`` per trajectory, or ``[B, T]`` per token, e.g. per-turn rewards on
turn-final tokens), the loss mask, ``group_ids`` ``[B]`` (trajectories of one prompt share an id;
groups may be ragged) and the algorithm config, and returns ``(advantages [B, T], metrics)`` with
advantages 0 at masked positions. Group estimators score a trajectory by the sum of its rewards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from correction.masked import check_like, live_mask, masked_stats, masked_whiten, zero_dead
from megatron_rl.algorithms.groups import (
    check_group_ids,
    check_rewards,
    group_centred,
    sequence_scores,
    token_rewards,
)
from megatron_rl.algorithms.registry import ADVANTAGE_ESTIMATORS

if TYPE_CHECKING:
    from megatron_rl.algorithms.config import AlgorithmConfig

Result = tuple[torch.Tensor, dict[str, torch.Tensor]]


def _inputs(
    rewards: torch.Tensor, loss_mask: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate; return the live mask, per-trajectory scores and the per-trajectory live flag."""
    live = live_mask(loss_mask)
    check_rewards(rewards, live)
    check_group_ids(group_ids, live.shape[0])
    return live, sequence_scores(rewards, live), live.any(-1)


def _broadcast(per_sequence: torch.Tensor, live: torch.Tensor) -> Result:
    advantages = zero_dead(per_sequence.unsqueeze(-1).expand(live.shape), live)
    return advantages, masked_stats("policy/advantages", advantages, live)


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor,
    config: AlgorithmConfig,
    values: torch.Tensor | None = None,
) -> Result:
    """(score - group mean), divided by (group std + epsilon) when ``grpo_norm_by_std``."""
    live, scores, seq_live = _inputs(rewards, loss_mask, group_ids)
    centred, std, _ = group_centred(scores, group_ids, seq_live)
    if config.grpo_norm_by_std:
        scale = std + config.advantage_epsilon
        centred = torch.where(scale > 0, centred / scale, 0.0)
    return _broadcast(centred, live)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor,
    config: AlgorithmConfig,
    values: torch.Tensor | None = None,
) -> Result:
    """Dr.GRPO: score - group mean, never std-normalised.

    Pair it with ``loss_agg_mode: seq-mean-token-sum-norm`` for the unbiased objective.
    """
    live, scores, seq_live = _inputs(rewards, loss_mask, group_ids)
    return _broadcast(group_centred(scores, group_ids, seq_live)[0], live)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor,
    config: AlgorithmConfig,
    values: torch.Tensor | None = None,
) -> Result:
    """Leave-one-out: score minus the mean of the other live trajectories of its group (0 alone)."""
    live, scores, seq_live = _inputs(rewards, loss_mask, group_ids)
    centred, _, count = group_centred(scores, group_ids, seq_live)
    return _broadcast(centred * count / (count - 1).clamp(min=1), live)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor,
    config: AlgorithmConfig,
    values: torch.Tensor | None = None,
) -> Result:
    """REINFORCE++: per-token discounted return-to-go (``gamma``), whitened over the batch."""
    live, _, _ = _inputs(rewards, loss_mask, group_ids)
    returns = returns_to_go(token_rewards(rewards, live), live, config.gamma)
    advantages = masked_whiten(returns, live)
    return advantages, masked_stats("policy/advantages", advantages, live)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor,
    config: AlgorithmConfig,
    values: torch.Tensor | None = None,
) -> Result:
    """REINFORCE++ with a group baseline: score - group mean on every token, whitened over the batch."""
    live, scores, seq_live = _inputs(rewards, loss_mask, group_ids)
    centred = group_centred(scores, group_ids, seq_live)[0]
    advantages = masked_whiten(centred.unsqueeze(-1).expand(live.shape), live)
    return advantages, masked_stats("policy/advantages", advantages, live)


def returns_to_go(token_rewards: torch.Tensor, live: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` over live tokens only (masked tokens neither earn nor discount)."""
    if gamma == 1.0:
        return zero_dead(token_rewards.flip(-1).cumsum(-1).flip(-1), live)
    out = torch.zeros_like(token_rewards)
    running = token_rewards.new_zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(live[:, t], token_rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(live[:, t], running, 0.0)
    return out


@ADVANTAGE_ESTIMATORS.register("gae")
def gae(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor,
    config: AlgorithmConfig,
    values: torch.Tensor | None = None,
) -> Result:
    """Generalised advantage estimation with critic ``values`` ``[B, T]``, ``gamma`` and ``lambd``.

    Masked tokens (observations between turns) are skipped: the next live token's value
    bootstraps. The critic's return target is ``advantages + values``.
    """
    live, _, _ = _inputs(rewards, loss_mask, group_ids)
    if values is None:
        raise ValueError("gae: needs critic values [batch, response_len]")
    check_like(live, values=values)
    r, v = token_rewards(rewards, live), zero_dead(values.detach(), live)
    out = torch.zeros_like(v)
    next_value = v.new_zeros(v.shape[0])
    running = v.new_zeros(v.shape[0])
    for t in reversed(range(v.shape[1])):
        delta = r[:, t] + config.gamma * next_value - v[:, t]
        running = torch.where(live[:, t], delta + config.gamma * config.lambd * running, running)
        next_value = torch.where(live[:, t], v[:, t], next_value)
        out[:, t] = torch.where(live[:, t], running, 0.0)
    return out, masked_stats("policy/advantages", out, live)
