"""The synchronous schedule: sample with version k, wait for rewards, train, transfer k+1, verify, repeat.

    generate → (reference / critic passes) → advantages → update (policy, critic) → weight transfer
    (+ verify) → eval / checkpoint

One optimizer step per batch, so the weights that define the clip ratio's "old" policy are the ones
the update starts from: the step uses its own detached log-probs as old log-probs (exact, and one
forward pass cheaper than a separate old-log-prob pass). The sampler/trainer mismatch is corrected
against the rollout log-probs the sampler returned (``algorithm.correction``).
"""

from __future__ import annotations

import time

from megatron_rl.checkpoint import save_checkpoint
from megatron_rl.contracts import GeneratorInput
from megatron_rl.schedules.batching import to_training_batch
from megatron_rl.schedules.components import Components, LoopState
from megatron_rl.schedules.evaluation import evaluate


class _Timer:
    def __init__(self, metrics: dict, name: str):
        self.metrics, self.name = metrics, name

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.metrics[f"timing/{self.name}"] = time.perf_counter() - self.start


async def run_sync(c: Components, state: LoopState) -> LoopState:
    """Train from ``state`` to ``schedule.total_steps``; returns the final state."""
    cfg = c.config
    if state.step == 0 and cfg.schedule.eval_every:
        c.tracker.log(0, await evaluate(c, state))
    for step in range(state.step, cfg.schedule.total_steps):
        metrics = await _step(c, state, step)
        state.step = step + 1
        state.data = c.train_data.state_dict()
        if _due(cfg.schedule.eval_every, state.step, cfg.schedule.total_steps):
            metrics.update(await evaluate(c, state))
        if _due(cfg.schedule.checkpoint_every, state.step, cfg.schedule.total_steps):
            save(c, state)
        c.tracker.log(state.step, metrics)
    return state


async def _step(c: Components, state: LoopState, step: int) -> dict[str, float]:
    cfg, metrics = c.config, {}
    start = time.perf_counter()
    prompts = c.train_data.next_batch(cfg.data.train_batch_size)
    gi = GeneratorInput(prompts, cfg.generator.n_samples_per_prompt, step, state.version)
    with _Timer(metrics, "generate"):
        out = await c.generator.generate(gi)
    c.folder.log_trajectories(out.trajectories)
    metrics.update(out.metrics)
    with _Timer(metrics, "score"):
        prepared = to_training_batch(out, cfg.algorithm, c.pad_token_id, c.policy)
    metrics.update(prepared.metrics)
    batch = prepared.batch
    if batch is not None:
        with _Timer(metrics, "train"):
            metrics.update(c.policy.train_step(batch))
            if prepared.returns is not None:
                metrics.update(c.policy.critic_step(batch, prepared.returns, prepared.values))
        state.version += 1
        with _Timer(metrics, "weight_sync"):
            metrics.update(await c.weight_sync(state.version))
    metrics["timing/step"] = time.perf_counter() - start
    metrics["policy/weight_version"] = float(state.version)
    return metrics


def _due(every: int, step: int, total: int) -> bool:
    return bool(every) and (step % every == 0 or step == total)


def save(c: Components, state: LoopState) -> None:
    cfg = c.config
    save_checkpoint(
        c.folder.root / "checkpoints", state.step, c.policy.save,
        {"step": state.step, "version": state.version, "data": state.data}, cfg.schedule.keep_checkpoints,
    )
