"""``data.*``: where prompts come from, how many per step, and the prompt-length limit."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataConfig:
    """Prompt files, or an environment's own generator when no files are given."""

    train_files: list[str] = field(default_factory=list)
    """Parquet or JSONL prompt files for training; empty generates ``generate_env`` data."""
    eval_files: list[str] = field(default_factory=list)
    """Prompt files for evaluation; empty evaluates the train files' test/eval split, else rows held out of them
    (``eval_holdout``); with no files at all, a held-out draw of ``generate_env`` data."""
    eval_holdout: int = 64
    """Train-file rows held out for evaluation when neither eval files nor an eval split exist (at most a tenth
    of the rows); 0 evaluates nothing."""
    generate_env: str = "arithmetic"
    """Environment whose generator makes the data when no files are given."""
    generate_knobs: dict = field(default_factory=dict)
    """Keyword arguments of that generator (e.g. ``{digits: 1, ops: "+"}``)."""
    num_generated_train: int = 2048
    """Generated training prompts."""
    num_generated_eval: int = 64
    """Generated evaluation prompts (drawn with another seed)."""
    train_batch_size: int = 16
    """Prompts (groups) per training step."""
    max_prompt_length: int = 512
    """Rendered prompt tokens (with tools); longer prompts are dropped and counted."""
    shuffle: bool = True
    """Shuffle each epoch with the run seed."""

    def __post_init__(self) -> None:
        for key in ("num_generated_train", "num_generated_eval", "train_batch_size", "max_prompt_length"):
            if getattr(self, key) < 1:
                raise ValueError(f"data.{key}: must be >= 1, got {getattr(self, key)}")
        if self.eval_holdout < 0:
            raise ValueError(f"data.eval_holdout: must be >= 0 (0 turns evaluation off), got {self.eval_holdout}")
