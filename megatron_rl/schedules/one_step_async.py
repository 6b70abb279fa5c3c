"""One-step asynchronous schedule: batch k+1 is sampled with version k while batch k trains.

    step k:  wait for batch k ─┬─ sync weights (version k) ─ start generating batch k+1 ─┐
                                └─────────────── train on batch k → version k+1 ─────────┘

Every batch is one step off-policy (its groups were sampled with the weights from before the
previous update; ``async/staleness_*`` report it). Weights move between steps, while no generation
is in flight, exactly as in the sync loop.
"""

from __future__ import annotations

import asyncio
import time

from megatron_rl.contracts import GeneratorInput, GeneratorOutput
from megatron_rl.schedules.components import Components, LoopState
from megatron_rl.schedules.evaluation import evaluate
from megatron_rl.schedules.lag import lag_metrics
from megatron_rl.schedules.phases import Timer, due, save, train_on


async def run_one_step_async(c: Components, state: LoopState) -> LoopState:
    """Train from ``state`` to ``schedule.total_steps``; returns the final state."""
    cfg, total = c.config, c.config.schedule.total_steps
    if state.step == 0 and cfg.schedule.eval_every:
        c.tracker.log(0, await evaluate(c, state))
    pending = _start_generation(c, state.step, state.version)
    served = state.version
    for step in range(state.step, total):
        metrics, start = {}, time.perf_counter()
        with Timer(metrics, "wait_for_generation_buffer"):
            out, generate_s = await pending
        if state.version != served:  # the fleet is idle: transfer the update of the previous step
            with Timer(metrics, "weight_sync"):
                metrics.update(await c.weight_sync(state.version))
            served = state.version
        position = c.train_data.state_dict()  # the first prompt not yet trained
        pending = _start_generation(c, step + 1, served) if step + 1 < total else None
        c.folder.log_trajectories(out.trajectories)
        metrics.update(out.metrics)
        metrics.update(lag_metrics(out.trajectories, state.version))
        if await asyncio.to_thread(train_on, c, out, metrics):
            state.version += 1
        state.step, state.data = step + 1, position
        if due(cfg.schedule.eval_every, state.step, total) or due(cfg.schedule.checkpoint_every, state.step, total):
            await _at_rest(c, state, pending, metrics)
            served = state.version
        metrics["timing/step"] = step_s = time.perf_counter() - start
        metrics["timing/generate"] = generate_s
        metrics["async/trainer_idle_fraction"] = metrics["timing/wait_for_generation_buffer"] / step_s
        metrics["async/sampler_idle_fraction"] = max(0.0, 1.0 - generate_s / step_s)
        metrics["policy/weight_version"] = float(state.version)
        c.tracker.log(state.step, metrics)
    return state


def _start_generation(c: Components, step: int, version: int) -> asyncio.Task[tuple[GeneratorOutput, float]]:
    prompts = c.train_data.next_batch(c.config.data.train_batch_size)
    gi = GeneratorInput(prompts, c.config.generator.n_samples_per_prompt, step, version)
    return asyncio.create_task(_timed(c.generator.generate(gi)))


async def _timed(work) -> tuple[GeneratorOutput, float]:
    start = time.perf_counter()
    return await work, time.perf_counter() - start


async def _at_rest(c: Components, state: LoopState, pending, metrics: dict) -> None:
    """Evaluate / checkpoint the new weights with nothing in flight: the batch generated ahead is
    awaited and kept (a resumed run draws its prompts again: the checkpoint's data position is before it)."""
    if pending is not None:
        with Timer(metrics, "wait_for_generation_buffer_at_rest"):
            await asyncio.wait([pending])
    with Timer(metrics, "weight_sync"):
        metrics.update(await c.weight_sync(state.version))
    cfg = c.config
    if due(cfg.schedule.eval_every, state.step, cfg.schedule.total_steps):
        metrics.update(await evaluate(c, state))
    if due(cfg.schedule.checkpoint_every, state.step, cfg.schedule.total_steps):
        save(c, state)
