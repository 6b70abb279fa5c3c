"""Shared scoring for single-turn envs whose reply ends in a final answer (arithmetic, math)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from megatron_rl.envs.answers import FORMATS, answers_match, extract_answer, to_number
from megatron_rl.envs.base import Env, StepResult


@dataclass
class AnswerConfig:
    """Reward shaping for a final-answer reply (``envs.<name>.*``)."""

    prefix: ClassVar[str] = "envs.answer"

    format_reward: float = 0.0
    """Reward for a reply whose answer is extracted but wrong (gives GRPO variance early)."""
    closeness_reward: float = 0.0
    """Extra reward for a wrong numeric answer: ``closeness_reward * max(0, 1 - |p - g| / (|g| + 1))``."""
    formats: tuple[str, ...] = FORMATS
    """Answer formats read from the reply, in priority order (hashes, boxed, answer_is)."""

    def __post_init__(self) -> None:
        for key in ("format_reward", "closeness_reward"):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"{self.prefix}.{key}: must lie in [0, 1), got {getattr(self, key)}")
        if self.format_reward + self.closeness_reward >= 1:
            raise ValueError(f"{self.prefix}.format_reward + closeness_reward: must stay below 1 (the correct answer's reward)")
        self.formats = tuple(self.formats)
        unknown = set(self.formats) - set(FORMATS)
        if unknown or not self.formats:
            raise ValueError(f"{self.prefix}.formats: {sorted(unknown) or 'empty'}; choose from {', '.join(FORMATS)}")


def score_answer(reply: str, gold: str, config: AnswerConfig) -> tuple[float, dict]:
    """Reward and metadata (correct, formatted) for ``reply`` against ``gold``."""
    predicted = extract_answer(reply, config.formats)
    if predicted is None:
        return 0.0, {"correct": 0.0, "formatted": 0.0}
    if answers_match(predicted, gold):
        return 1.0, {"correct": 1.0, "formatted": 1.0}
    p, g = to_number(predicted), to_number(gold)
    close = 0.0 if p is None or g is None else max(0.0, 1 - float(abs(p - g)) / (float(abs(g)) + 1))
    return config.format_reward + config.closeness_reward * close, {"correct": 0.0, "formatted": 1.0}


class AnswerEnv(Env):
    """Single turn: the reply's final answer is compared with ``extras["answer"]``."""

    Config = AnswerConfig
    required_extras = ("answer",)

    def __init__(self, extras: dict, config=None):
        super().__init__(extras, config)
        if "answer" not in extras:
            raise ValueError(f"env_extras for env_class '{self.name}': needs key 'answer' (got {sorted(extras)})")
        self.answer = str(extras["answer"])

    def step(self, action: str) -> StepResult:
        reward, meta = score_answer(action, self.answer, self.config)
        self.metrics = dict(meta)
        return StepResult([], reward, True, meta)
