"""DAPO dynamic sampling for the synchronous schedule (``algorithm.filters.dynamic_sampling_type=replace``).

A group whose rewards do not vary (every answer right, or every one wrong) gives GRPO no gradient. After a
step's batch is sampled, more prompts are sampled until ``dynamic_sampling_target_groups`` groups carry a
signal or ``dynamic_sampling_max_rounds`` rounds have run; ``to_training_batch`` then trains on the first
target groups that do. Each extra round draws as many prompts as the yield so far says are still needed, at
most one batch. The asynchronous schedules do not sample extra rounds: fully_async's pool already keeps
generating until a batch of useful groups (``algorithm.filters.zero_variance_filter``).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable

from megatron_rl.contracts import FAILED, GeneratorInput, GeneratorOutput, Trajectory
from megatron_rl.schedules.components import Components


def has_signal(group: Iterable[Trajectory], tolerance: float) -> bool:
    """The group's live trajectories (not failed, something to train on) have rewards with std > ``tolerance``."""
    rewards = [t.reward_sum() for t in group if t.stop_reason != FAILED and any(t.loss_mask)]
    return len(rewards) > 1 and statistics.pstdev(rewards) > tolerance


def _groups(out: GeneratorOutput) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in out.trajectories:
        groups[t.trajectory_id.instance_id].append(t)
    return groups


async def sample_until_signal(c: Components, out: GeneratorOutput, step: int, version: int
                              ) -> tuple[GeneratorOutput, dict[str, float]]:
    """``out`` plus the extra groups sampled for it (each logged to the ledger), and the rounds' metrics."""
    filters = c.config.algorithm.filters
    if filters.dynamic_sampling_type != "replace":
        return out, {}
    target, rounds = filters.dynamic_sampling_target_groups, 1
    groups = _groups(out)
    useful = sum(has_signal(g, filters.zero_variance_tol) for g in groups.values())
    while useful < target and rounds < filters.dynamic_sampling_max_rounds:
        want = min(c.config.data.train_batch_size, math.ceil((target - useful) * len(groups) / max(useful, 1)))
        prompts = {p.instance_id: p for p in c.train_data.next_batch(want) if p.instance_id not in groups}
        if not prompts:  # the dataset is smaller than what this step has sampled already
            break
        more = await c.generator.generate(GeneratorInput(list(prompts.values()), c.config.generator.n_samples_per_prompt,
                                                         step, version))
        c.folder.log_trajectories(more.trajectories)
        out = GeneratorOutput(out.trajectories + more.trajectories, out.metrics)
        groups, rounds = _groups(out), rounds + 1
        useful = sum(has_signal(g, filters.zero_variance_tol) for g in groups.values())
    return out, {"generate/dynamic_sampling_rounds": float(rounds), "generate/dynamic_sampling_groups": float(len(groups))}
