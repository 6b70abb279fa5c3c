"""From a GeneratorOutput to a TrainingBatch: rewards → filters → advantages → padded rows."""

from __future__ import annotations

import torch

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.filters import zero_variance_filter
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


def to_training_batch(
    output: GeneratorOutput, config: AlgorithmConfig, pad_token_id: int
) -> tuple[TrainingBatch | None, dict[str, float]]:
    """Advantages by the configured estimator; None when every group was filtered out."""
    if config.advantage_estimator == "gae":
        raise ValueError("algorithm.advantage_estimator=gae needs a critic, which the sync schedule does not run yet; "
                         "use grpo, dr_grpo, rloo or reinforce_pp")
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
    if config.filters.zero_variance_filter:
        keep, filter_metrics = zero_variance_filter(rewards, group_ids, mask, config.filters.zero_variance_tol)
        metrics.update({k: float(v) for k, v in filter_metrics.items()})
    else:
        keep = mask.any(-1)
    metrics["train/kept_trajectories"] = float(keep.sum())
    if not bool(keep.any()):
        return None, metrics
    rows = torch.nonzero(keep)[:, 0]
    estimator = ADVANTAGE_ESTIMATORS.get(config.advantage_estimator)
    advantages, adv_metrics = estimator(rewards[rows], mask[rows], group_ids[rows], config)
    metrics.update({k: float(v) for k, v in adv_metrics.items()})
    kept = [trajectories[i] for i in rows.tolist()]
    per_row = [advantages[i, : len(t.response_ids)] for i, t in enumerate(kept)]
    batch = TrainingBatch.from_trajectories(kept, per_row, group_ids[rows].tolist(), pad_token_id)
    if filters.overlong_filtering:  # truncated replies count in the baseline but carry no gradient
        truncated = torch.tensor([t.stop_reason in TRUNCATED for t in kept])
        batch.loss_mask[truncated] = 0.0
        metrics["reward/overlong_filtered_ratio"] = float(truncated.float().mean())
    return batch, metrics
