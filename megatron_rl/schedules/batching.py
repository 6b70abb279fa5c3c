"""From a GeneratorOutput to a TrainingBatch: rewards → filters → (reference, KL penalty, values) →
advantages → padded rows.

Rewards and advantages are computed on response rows ``[B, R]`` (response token ``t`` of every
trajectory in column ``t``); the batch holds prompt and response ``[B, T]`` with response token ``t``
at position ``prompt_length + t``. Reference log-probs and critic values come from the worker
group on the batch and are read back at those positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.filters import dynamic_sampling, zero_variance_filter
from megatron_rl.algorithms.kl import kl_penalty_rewards
from megatron_rl.algorithms.overlong import soft_overlong_penalty
from megatron_rl.algorithms.registry import ADVANTAGE_ESTIMATORS
from megatron_rl.contracts import GeneratorOutput, TrainingBatch, Trajectory
from megatron_rl.generator.episode import TRUNCATED


def _response_rows(trajectories: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, R]`` per-token rewards (scalar rewards on the last token) and loss masks."""
    width = max(len(t.response_ids) for t in trajectories)
    rewards = torch.zeros(len(trajectories), width)
    mask = torch.zeros(len(trajectories), width)
    for b, t in enumerate(trajectories):
        n = len(t.response_ids)
        mask[b, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        if isinstance(t.rewards, list):
            rewards[b, :n] = torch.tensor(t.rewards, dtype=torch.float32)
        else:
            rewards[b, n - 1] = float(t.rewards)
    return rewards, mask


def _group_ids(trajectories: list[Trajectory]) -> torch.Tensor:
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(t.trajectory_id.instance_id, len(ids)) for t in trajectories])


class Scorer(Protocol):
    """The worker group's passes that advantages may need."""

    def compute_ref_logprobs(self, batch: TrainingBatch) -> torch.Tensor: ...

    def compute_values(self, batch: TrainingBatch) -> torch.Tensor: ...


@dataclass
class PreparedBatch:
    """A batch ready for the policy update, and the critic's targets when GAE made its advantages."""

    batch: TrainingBatch | None
    """None when every trajectory was filtered out."""
    metrics: dict[str, float] = field(default_factory=dict)
    values: torch.Tensor | None = None
    """``[B, T]`` critic values the advantages bootstrapped from (the value loss's clip centre)."""
    returns: torch.Tensor | None = None
    """``[B, T]`` value targets: advantages + values."""


def to_training_batch(
    output: GeneratorOutput, config: AlgorithmConfig, pad_token_id: int, scorer: Scorer | None = None,
    temperature: float = 1.0,
) -> PreparedBatch:
    """Advantages by the configured estimator. ``scorer`` supplies reference log-probs (``algorithm.kl``)
    and critic values (``gae``); it may be None when neither is configured. ``temperature``: what the rollouts
    were sampled at (``generator.temperature``), the batch's log-prob temperature; greedy rollouts (0) at 1."""
    needs_reference = config.kl.needs_reference
    if scorer is None and (needs_reference or config.advantage_estimator == "gae"):
        raise ValueError("algorithm.kl / advantage_estimator=gae need the worker group's reference or critic passes")
    trajectories = output.trajectories
    rewards, mask = _response_rows(trajectories)
    group_ids = _group_ids(trajectories)
    metrics: dict[str, float] = {}
    filters = config.filters
    if filters.overlong_buffer_len:
        penalty, m = soft_overlong_penalty(mask.sum(-1), filters)
        last = torch.tensor([len(t.response_ids) - 1 for t in trajectories])
        rewards[torch.arange(len(trajectories)), last] += torch.where(mask.any(-1), penalty, 0.0)
        metrics.update({k: float(v) for k, v in m.items()})
    if filters.dynamic_sampling_type:
        keep, filter_metrics = dynamic_sampling(rewards, group_ids, mask, filters)
        metrics.update({k: float(v) for k, v in filter_metrics.items()})
    elif filters.zero_variance_filter:
        keep, filter_metrics = zero_variance_filter(rewards, group_ids, mask, filters.zero_variance_tol)
        metrics.update({k: float(v) for k, v in filter_metrics.items()})
    else:
        keep = mask.any(-1)
    metrics["train/kept_trajectories"] = float(keep.sum())
    if not bool(keep.any()):
        return PreparedBatch(None, metrics)
    rows = torch.nonzero(keep)[:, 0]
    kept = [trajectories[i] for i in rows.tolist()]
    rewards, mask, group_ids = rewards[rows], mask[rows], group_ids[rows]
    width = rewards.shape[1]  # the longest response of the whole output, kept or not
    batch = TrainingBatch.from_trajectories(
        kept, [torch.zeros(len(t.response_ids)) for t in kept], group_ids.tolist(), pad_token_id,
        temperature=temperature if temperature > 0 else 1.0,
    )
    if needs_reference:
        batch.ref_logprobs = scorer.compute_ref_logprobs(batch).float()
        if config.kl.use_kl_in_reward:  # the sampler's log-probs stand for the policy's: same weights
            rewards, kl_metrics = kl_penalty_rewards(
                rewards, _at_responses(batch.rollout_logprobs, batch, kept, width),
                _at_responses(batch.ref_logprobs, batch, kept, width), mask, config.kl,
            )
            metrics.update({k: float(v) for k, v in kl_metrics.items()})
    estimator = ADVANTAGE_ESTIMATORS.get(config.advantage_estimator)
    values = None
    if config.advantage_estimator == "gae":
        values = scorer.compute_values(batch).float()
        at_responses = _at_responses(values, batch, kept, width)
        advantages, adv_metrics = estimator(rewards, mask, group_ids, config, values=at_responses)
    else:
        advantages, adv_metrics = estimator(rewards, mask, group_ids, config)
    metrics.update({k: float(v) for k, v in adv_metrics.items()})
    batch.advantages = _from_responses(advantages, batch, kept)
    if filters.overlong_filtering:  # truncated replies count in the baseline but carry no gradient
        truncated = torch.tensor([t.stop_reason in TRUNCATED for t in kept])
        batch.loss_mask[truncated] = 0.0
        metrics["reward/overlong_filtered_ratio"] = float(truncated.float().mean())
    if values is None:
        return PreparedBatch(batch, metrics)
    values = values * batch.loss_mask
    return PreparedBatch(batch, metrics, values, batch.advantages + values)


def _at_responses(full: torch.Tensor, batch: TrainingBatch, kept: list[Trajectory], width: int) -> torch.Tensor:
    """``[B, T]`` batch positions -> ``[B, width]`` response rows."""
    out = torch.zeros(len(kept), width)
    for b, (p, t) in enumerate(zip(batch.prompt_lengths.tolist(), kept)):
        out[b, : len(t.response_ids)] = full[b, p : p + len(t.response_ids)]
    return out


def _from_responses(rows: torch.Tensor, batch: TrainingBatch, kept: list[Trajectory]) -> torch.Tensor:
    """``[B, R]`` response rows -> ``[B, T]`` batch positions (0 on prompts and padding)."""
    out = torch.zeros_like(batch.loss_mask)
    for b, (p, t) in enumerate(zip(batch.prompt_lengths.tolist(), kept)):
        out[b, p : p + len(t.response_ids)] = rows[b, : len(t.response_ids)]
    return out
