"""``schedule.*`` and ``sft.*``: how many steps, when to evaluate and checkpoint, the SFT warm start."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("sync",)


@dataclass
class ScheduleConfig:
    """The training loop."""

    type: str = "sync"
    """sync: sample with version k, train, transfer k+1, verify, repeat."""
    total_steps: int = 20
    """RL steps (one batch of groups each)."""
    eval_every: int = 5
    """Evaluate every N steps, before the first and after the last (0: never)."""
    checkpoint_every: int = 0
    """Checkpoint every N steps (0: never; the last step is checkpointed whenever this is set)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept."""

    def __post_init__(self) -> None:
        if self.type not in SCHEDULES:
            raise ValueError(f"schedule.type: {self.type!r} is not one of {SCHEDULES}")
        if self.total_steps < 1:
            raise ValueError(f"schedule.total_steps: must be >= 1, got {self.total_steps}")
        for key in ("eval_every", "checkpoint_every"):
            if getattr(self, key) < 0:
                raise ValueError(f"schedule.{key}: must be >= 0 (0 disables), got {getattr(self, key)}")
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
