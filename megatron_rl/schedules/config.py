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
    """Optimizer steps of cross-entropy on demonstrations (the most, when ``stop_at_accuracy`` is set)."""
    batch_size: int = 32
    """Demonstrations per step."""
    lr: float | None = None
    """Constant learning rate of the warm start; RL then starts ``trainer.optimizer``'s schedule at its step 0.
    None: SFT steps run on (and advance) the trainer's schedule."""
    stop_at_accuracy: float = 0.0
    """Stop early once the greedy pass rate on ``check_prompts`` training prompts reaches this (0: run all
    ``steps``). RL then starts from the same accuracy whatever the seed, instead of wherever a fixed step count
    lands on a steep SFT curve. The check never sees the eval split."""
    check_every: int = 5
    """With ``stop_at_accuracy``: steps between checks (each syncs the weights to the fleet and samples greedily)."""
    check_prompts: int = 64
    """With ``stop_at_accuracy``: training prompts in the check, the same ones every time."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1:
            raise ValueError("sft.steps must be >= 0 and sft.batch_size >= 1")
        if not 0.0 <= self.stop_at_accuracy <= 1.0:
            raise ValueError(f"sft.stop_at_accuracy: a pass rate in [0, 1] (0: off), got {self.stop_at_accuracy}")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"sft.lr: must be > 0 or null (the trainer's schedule), got {self.lr}")
        if self.check_every < 1 or self.check_prompts < 1:
            raise ValueError("sft.check_every and sft.check_prompts must be >= 1")
