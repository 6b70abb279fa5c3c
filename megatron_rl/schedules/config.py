"""``schedule.*`` and ``sft.*``: how many steps, when to evaluate and checkpoint, the SFT warm start."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("sync", "one_step_async", "fully_async")


@dataclass
class ScheduleConfig:
    """The training loop."""

    type: str = "sync"
    """sync: sample with version k, train, transfer k+1, verify, repeat. one_step_async: batch k+1 is
    sampled with version k while batch k trains. fully_async: groups stream into a buffer under a
    staleness budget; the trainer takes data.train_batch_size groups per step."""
    total_steps: int = 20
    """RL steps (one batch of groups each)."""
    eval_every: int = 5
    """Evaluate every N steps, before the first and after the last (0: never)."""
    checkpoint_every: int = 0
    """Checkpoint every N steps (0: never; the last step is checkpointed whenever this is set)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept."""
    staleness: int = 1
    """fully_async: staleness budget S; groups start while accepted + running < (S + step) * batch groups."""
    max_running_groups: int = 0
    """fully_async: groups generating at once (0: batch groups * (S + 1), all the budget allows)."""
    max_lag: int | None = None
    """fully_async: drop a group more than this many steps old when it would train (None: train it, count a violation)."""

    def __post_init__(self) -> None:
        if self.type not in SCHEDULES:
            raise ValueError(f"schedule.type: {self.type!r} is not one of {SCHEDULES}")
        if self.total_steps < 1:
            raise ValueError(f"schedule.total_steps: must be >= 1, got {self.total_steps}")
        for key in ("eval_every", "checkpoint_every"):
            if getattr(self, key) < 0:
                raise ValueError(f"schedule.{key}: must be >= 0 (0 disables), got {getattr(self, key)}")
        if self.staleness < 0 or self.max_running_groups < 0:
            raise ValueError("schedule.staleness and schedule.max_running_groups must be >= 0")
        if self.max_lag is not None and self.max_lag < self.staleness:
            raise ValueError(f"schedule.max_lag ({self.max_lag}) must be >= schedule.staleness ({self.staleness}) or null")
        if self.keep_checkpoints < 1:
            raise ValueError("schedule.keep_checkpoints: must be >= 1")


@dataclass
class SFTConfig:
    """Supervised warm start on the environment's demonstrations before RL (0 steps: none)."""

    steps: int = 0
    """Optimizer steps of cross-entropy on demonstrations."""
    batch_size: int = 32
    """Demonstrations per step."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1:
            raise ValueError("sft.steps must be >= 0 and sft.batch_size >= 1")
