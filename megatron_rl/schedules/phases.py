"""The phases every schedule shares: train on generated groups, time a phase, decide and write checkpoints."""

from __future__ import annotations

import time

from megatron_rl.checkpoint import save_checkpoint
from megatron_rl.contracts import GeneratorOutput
from megatron_rl.schedules.batching import to_training_batch
from megatron_rl.schedules.components import Components, LoopState
from megatron_rl.schedules.ppo_update import update_policy


class Timer:
    """``with Timer(metrics, "train"):`` sets ``metrics["timing/train"]`` to the block's seconds."""

    def __init__(self, metrics: dict, name: str):
        self.metrics, self.name = metrics, name

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.metrics[f"timing/{self.name}"] = time.perf_counter() - self.start


def train_on(c: Components, out: GeneratorOutput, metrics: dict) -> bool:
    """Score ``out`` into a batch and update policy (and critic); False when every trajectory was filtered."""
    with Timer(metrics, "score"):
        prepared = to_training_batch(out, c.config.algorithm, c.pad_token_id, c.policy, c.config.generator.temperature)
    metrics.update(prepared.metrics)
    if prepared.batch is None:
        return False
    with Timer(metrics, "train"):
        metrics.update(update_policy(c.policy, prepared.batch, c.config.algorithm))
        if prepared.returns is not None:
            metrics.update(c.policy.critic_step(prepared.batch, prepared.returns, prepared.values))
    return True


def due(every: int, step: int, total: int) -> bool:
    return bool(every) and (step % every == 0 or step == total)


def save(c: Components, state: LoopState) -> None:
    cfg = c.config
    loop = {"step": state.step, "version": state.version, "data": state.data, "ledger_records": _ledger_records(c)}
    if state.async_state:
        loop["async"] = state.async_state
    save_checkpoint(c.folder.root / "checkpoints", state.step, c.policy.save, loop, cfg.schedule.keep_checkpoints)


def _ledger_records(c: Components) -> int:
    """Lines of ``trajectories.jsonl`` now: a resumed run's records after this many are its own; those a
    killed run wrote between this checkpoint and its death belong to discarded work."""
    path = c.folder.root / "trajectories.jsonl"
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(1 for _ in f)
