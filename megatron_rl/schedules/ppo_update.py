"""The policy update over one batch: ``algorithm.ppo_epochs`` passes of mini-batches of
``algorithm.ppo_mini_batch_size`` groups, one optimizer step each.

With one step per batch the update's own detached log-probs are the old ones (exact, one forward
cheaper). With more, the old policy is fixed before the first step: a separate log-prob pass with the
batch's starting weights (``old_logprobs=trainer``) or the sampler's log-probs (``rollout``), so that
later mini-batches see a ratio away from 1 and clipping acts on real policy lag. R2 (routing replay of
that pass) records the pass's experts and every step replays them.
"""

from __future__ import annotations

import torch

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.contracts import TrainingBatch


def mini_batches(batch: TrainingBatch, groups_per_step: int) -> list[list[int]]:
    """Row indices of each mini-batch: whole groups, in the batch's order (0: one mini-batch)."""
    order: dict[int, list[int]] = {}
    for row, group in enumerate(batch.group_ids.tolist()):
        order.setdefault(group, []).append(row)
    groups = list(order.values())
    size = groups_per_step or len(groups)
    return [sum(groups[i : i + size], []) for i in range(0, len(groups), size)]


def _fix_old_policy(policy, batch: TrainingBatch, algo: AlgorithmConfig) -> None:
    """The old log-probs of a multi-step update and, with R2, the experts every step replays: those the
    batch's starting weights route to (recorded in the old-log-prob pass), so a later mini-batch's ratio
    measures the policy's change through the same experts rather than a change of experts."""
    r2 = algo.routing_replay.mode.value == "r2"
    if algo.old_logprobs == "rollout" and not r2:
        batch.old_logprobs = batch.rollout_logprobs
        return
    logp, _, routed = policy.compute_logprobs(batch, record_routing=r2)
    batch.old_logprobs = logp.float() if algo.old_logprobs == "trainer" else batch.rollout_logprobs
    if r2:
        batch.routed_experts = routed


# The first step's values of these are kept as ``*_first``: only that step runs on the weights the sampler had
# (a later step's trainer has moved), so they measure the sampler/trainer mismatch alone. On CPU, float32 both
# sides, a unit-size MoE under R3 with tiny_moe_cpu's four steps per batch averaged a 0.005-0.011 log-prob gap
# and 1.0-2.4% of routers disagreeing over steps 1-2, all of it the updates' change: in the first step the gap
# was 1.7e-7 and no router disagreed.
FIRST = ("policy/rollout_train_logprob_abs_diff", "policy/rollout_train_k3_kl", "policy/rollout_train_ratio_beyond_2x",
         "routing/disagreement", "routing/tokens_differing")


def update_policy(policy, batch: TrainingBatch, algo: AlgorithmConfig) -> dict[str, float]:
    """Every optimizer step of the batch; per-step metrics are averaged, ``policy/*_last`` keep the last and
    ``*_first`` the first (see ``FIRST``)."""
    parts = mini_batches(batch, algo.ppo_mini_batch_size)
    steps = len(parts) * algo.ppo_epochs
    if steps > 1:
        _fix_old_policy(policy, batch, algo)
    per_step = [policy.train_step(batch.select(rows) if len(parts) > 1 else batch)
                for _ in range(algo.ppo_epochs) for rows in parts]
    metrics = {k: sum(m[k] for m in per_step) / steps for k in per_step[0]}
    for key in ("policy/ppo_clip_ratio", "policy/ppo_kl", "routing/disagreement", "routing/tokens_differing"):
        if key in per_step[-1]:
            metrics[f"{key}_last"] = per_step[-1][key]
            metrics[f"{key}_max"] = max(m[key] for m in per_step)
    metrics.update({f"{key}_first": per_step[0][key] for key in FIRST if key in per_step[0]})
    metrics["policy/optimizer_steps"] = float(steps)
    return metrics

