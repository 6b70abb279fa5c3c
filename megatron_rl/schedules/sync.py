"""The synchronous schedule: sample with version k, wait for rewards, train, transfer k+1, verify, repeat.

    generate → (reference / critic passes) → advantages → update (policy, critic) → weight transfer
    (+ verify) → eval / checkpoint

With DAPO dynamic sampling (``algorithm.filters.dynamic_sampling_type=replace``) the generate phase samples
extra groups until enough of them carry a signal (``dynamic_sampling``). The update is ``ppo_update.update_policy``: one optimizer step per batch by default (the step's own
detached log-probs are the old ones), or PPO mini-batches and epochs with old log-probs from a
separate pass. The sampler/trainer mismatch is corrected against the rollout log-probs the sampler
returned (``algorithm.correction``).
"""

from __future__ import annotations

import time

from megatron_rl.console import bar
from megatron_rl.contracts import GeneratorInput
from megatron_rl.schedules.components import Components, LoopState
from megatron_rl.schedules.dynamic_sampling import sample_until_signal
from megatron_rl.schedules.evaluation import evaluate
from megatron_rl.schedules.phases import Timer, due, save, train_on


async def run_sync(c: Components, state: LoopState) -> LoopState:
    """Train from ``state`` to ``schedule.total_steps``; returns the final state."""
    cfg = c.config
    if state.step == 0 and cfg.schedule.eval_every:
        c.tracker.log(0, await evaluate(c, state))
    progress = bar(cfg.schedule.total_steps, "rl steps")
    progress.update(state.step)
    for step in range(state.step, cfg.schedule.total_steps):
        metrics = await _step(c, state, step)
        progress.update()
        state.step = step + 1
        state.data = c.train_data.state_dict()
        if due(cfg.schedule.eval_every, state.step, cfg.schedule.total_steps):
            metrics.update(await evaluate(c, state))
        if due(cfg.schedule.checkpoint_every, state.step, cfg.schedule.total_steps):
            save(c, state)
        c.tracker.log(state.step, metrics)
    progress.close()
    return state


async def _step(c: Components, state: LoopState, step: int) -> dict[str, float]:
    cfg, metrics = c.config, {}
    start = time.perf_counter()
    prompts = c.train_data.next_batch(cfg.data.train_batch_size)
    gi = GeneratorInput(prompts, cfg.generator.n_samples_per_prompt, step, state.version)
    with Timer(metrics, "generate"):
        out = await c.generator.generate(gi)
        c.folder.log_trajectories(out.trajectories)
        out, sampling = await sample_until_signal(c, out, step, state.version)
    metrics.update(out.metrics)
    metrics.update(sampling)
    if train_on(c, out, metrics):
        state.version += 1
        with Timer(metrics, "weight_sync"):
            metrics.update(await c.weight_sync(state.version))
    metrics["timing/step"] = time.perf_counter() - start
    metrics["policy/weight_version"] = float(state.version)
    return metrics
