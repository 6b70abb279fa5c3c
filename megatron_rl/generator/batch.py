"""Roll out a GeneratorInput: bounded concurrency, retries of failed episodes, failed groups kept out."""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections import Counter

from megatron_rl.contracts import FAILED, GeneratorInput, GeneratorOutput, PromptItem, Trajectory, TrajectoryId
from megatron_rl.generator.env_metrics import environment_metrics
from megatron_rl.generator.episode import EnvFailure, EpisodeContext, run_episode

log = logging.getLogger(__name__)


async def _attempts(ctx: EpisodeContext, item: PromptItem, tid: TrajectoryId, make_env, limit: asyncio.Semaphore):
    """The episode, retried from the start as a fresh sample while the environment fails."""
    errors = []
    for attempt in range(1, ctx.config.max_env_attempts + 1):
        async with limit:
            env = make_env(item)
            try:
                return await run_episode(ctx, item, env, tid), attempt
            except EnvFailure as err:
                errors.append(str(err))
                log.warning("trajectory %s: environment failed (%s); retrying as a fresh sample", tid, err)
            finally:
                env.close()
                ctx.fleet.end_session(str(tid))
    return errors, ctx.config.max_env_attempts


def _failed(tid: TrajectoryId, ctx: EpisodeContext, pad_id: int, errors: list[str]) -> Trajectory:
    """A placeholder record for a group kept out of the gradient and the baseline."""
    return Trajectory(
        trajectory_id=tid, prompt_token_ids=[pad_id], response_ids=[pad_id], loss_mask=[0], rewards=0.0,
        rollout_logprobs=[0.0], policy_versions=[0], group_step=ctx.step, stop_reason=FAILED,
        env_metrics={"env_errors": float(len(errors))},
    )


def _exclude(t: Trajectory) -> Trajectory:
    t.loss_mask = [0] * len(t.response_ids)
    t.rewards = 0.0
    t.stop_reason = FAILED
    t.validate()
    return t


async def generate_batch(ctx: EpisodeContext, gi: GeneratorInput, make_env, pad_id: int, progress=None) -> GeneratorOutput:
    """All groups of ``gi`` in input order; a group with any episode failing every attempt is excluded."""
    limit = asyncio.Semaphore(ctx.config.max_concurrency)
    ids = gi.trajectory_ids()
    items = {p.instance_id: p for p in gi.prompts}

    async def one(tid: TrajectoryId):
        result = await _attempts(ctx, items[tid.instance_id], tid, make_env, limit)
        if progress is not None:
            progress()
        return result

    results, attempts = zip(*await asyncio.gather(*(one(tid) for tid in ids)))
    failed_groups = {tid.instance_id for tid, r in zip(ids, results) if isinstance(r, list)}
    trajectories = [
        _failed(tid, ctx, pad_id, r) if isinstance(r, list) else (_exclude(r) if tid.instance_id in failed_groups else r)
        for tid, r in zip(ids, results)
    ]
    metrics = {**_metrics(trajectories, len(failed_groups)), **environment_metrics(trajectories, list(attempts))}
    return GeneratorOutput(trajectories, metrics)


def _metrics(trajectories: list[Trajectory], failed_groups: int) -> dict[str, float]:
    live = [t for t in trajectories if t.stop_reason != FAILED]
    metrics = {"generate/failed_groups": float(failed_groups), "generate/num_trajectories": float(len(trajectories))}
    if live:
        metrics.update({
            "generate/response_length": statistics.fmean(sum(t.loss_mask) for t in live),
            "generate/total_length": statistics.fmean(t.num_tokens for t in live),
            "generate/num_turns": statistics.fmean(_turns(t) for t in live),
            "generate/with_routed_experts": statistics.fmean(t.routed_experts is not None for t in live),
            "reward/mean": statistics.fmean(t.reward_sum() for t in live),
            "timing/llm_per_trajectory": statistics.fmean(t.timing.get("llm", 0.0) for t in live),
            "timing/env_per_trajectory": statistics.fmean(t.timing.get("env", 0.0) for t in live),
        })
        for reason, count in Counter(t.stop_reason for t in live).items():
            metrics[f"generate/stop_{reason}"] = count / len(live)
        for key in sorted({k for t in live for k in t.env_metrics}):
            metrics[f"env/{key}"] = statistics.fmean(t.env_metrics.get(key, 0.0) for t in live)
    return metrics


def _turns(t: Trajectory) -> int:
    """Assistant turns: runs of mask-1 tokens."""
    return sum(1 for i, m in enumerate(t.loss_mask) if m and (i == 0 or not t.loss_mask[i - 1]))
