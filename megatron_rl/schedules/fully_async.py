"""Fully asynchronous schedule: generation never stops; the trainer takes mini-batches of B groups.

    producers (group_pool): start groups while  accepted + running < (S + s) * B  → buffer
    trainer, step s:  take B groups ─ train → version s ─ weight sync (fleet paused in
                      ``weight_transfer.pause_mode``, keep by default; in-flight groups continue on
                      the new weights) ─ capacity += B ─ eval / checkpoint

B is ``data.train_batch_size`` (groups), S ``schedule.staleness``. Tokens carry the version that
sampled them, so the correction and ``async/token_lag_*`` see real per-token lag; a group scheduled
more than S steps before it trains is trained and counted as a violation (``schedule.max_lag`` drops
it instead). A checkpoint holds the admission counts and the prompts drawn but not trained or
filtered; a resumed run generates those first.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from megatron_rl.contracts import GeneratorOutput
from megatron_rl.schedules.admission import AdmissionController
from megatron_rl.schedules.components import Components, LoopState
from megatron_rl.schedules.evaluation import evaluate
from megatron_rl.schedules.group_pool import Group, GroupPool
from megatron_rl.schedules.lag import lag_metrics
from megatron_rl.schedules.phases import Timer, due, save, train_on


async def run_fully_async(c: Components, state: LoopState) -> LoopState:
    """Train from ``state`` to ``schedule.total_steps``; returns the final state."""
    cfg, total = c.config, c.config.schedule.total_steps
    if state.step == 0 and cfg.schedule.eval_every:
        c.tracker.log(0, await evaluate(c, state))
    c.generator.show_progress = False  # one bar per group would interleave
    pool = _pool(c, state)
    try:
        for step in range(state.step, total):
            metrics, start, idle = {}, time.perf_counter(), pool.idle_seconds()
            with Timer(metrics, "wait_for_generation_buffer"):
                groups = await pool.take(cfg.data.train_batch_size)
            out = _merge(groups)
            c.folder.log_trajectories(out.trajectories)
            metrics.update({**out.metrics, **lag_metrics(out.trajectories, state.version)})
            if await asyncio.to_thread(train_on, c, out, metrics):
                state.version += 1
                with Timer(metrics, "weight_sync"):
                    metrics.update(await c.weight_sync(state.version))
            await pool.finish_step()
            state.step = step + 1
            if due(cfg.schedule.eval_every, state.step, total):
                metrics.update(await evaluate(c, state))
            # data position, pending prompts and the ledger's length are read together, nothing awaited between
            state.data, state.async_state = c.train_data.state_dict(), pool.state_dict()
            if due(cfg.schedule.checkpoint_every, state.step, total):
                save(c, state)
            metrics.update(_step_metrics(pool, metrics, time.perf_counter() - start, idle, state.version))
            c.tracker.log(state.step, metrics)
    finally:
        await pool.close()
    return state


def _pool(c: Components, state: LoopState) -> GroupPool:
    sched, saved = c.config.schedule, state.async_state
    counts = AdmissionController.counts_from(saved["counts"]) if saved else None
    groups = c.config.data.train_batch_size
    admission = AdmissionController(groups, sched.staleness, sched.max_running_groups or groups * (sched.staleness + 1),
                                    sched.max_lag, counts)
    by_id = {item.instance_id: item for item in c.train_data.items}
    requeue = [by_id[i] for i in saved.get("pending", [])]
    return GroupPool(c, admission, requeue, version=lambda: state.version)


def _merge(groups: list[Group]) -> GeneratorOutput:
    """One batch of the groups' trajectories; generation metrics averaged over groups."""
    keys = set.intersection(*(set(g.output.metrics) for g in groups))
    metrics = {k: statistics.fmean(g.output.metrics[k] for g in groups) for k in keys}
    return GeneratorOutput([t for g in groups for t in g.output.trajectories], metrics)


def _step_metrics(pool: GroupPool, metrics: dict, step_s: float, idle_before: float, version: int) -> dict:
    return {
        **pool.admission.metrics(),
        "async/trainer_idle_fraction": metrics["timing/wait_for_generation_buffer"] / step_s,
        "async/sampler_idle_fraction": (pool.idle_seconds() - idle_before) / step_s,
        "timing/step": step_s,
        "policy/weight_version": float(version),
    }
