"""The environment protocol: ``init(prompt) -> (prompt, metadata)``, ``step(action) -> StepResult``, ``close()``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import ClassVar

Message = dict
"""A chat message: ``{"role": ..., "content": str}``."""


class EnvError(RuntimeError):
    """The environment itself failed (not the model): the generator retries the rollout."""


class TaskBug(EnvError):
    """An episode ended without a score: the task or its environment is broken, not the model's reply."""


@dataclass(frozen=True)
class StepResult:
    """What the environment answers to one assistant turn."""

    observations: list[Message]
    """Messages to append as the next turn(s): role ``tool`` or ``user``, string content. Empty when done."""
    reward: float | None
    """This turn's reward (the generator puts it on the turn's last token); None only while not done."""
    done: bool
    """True when the episode is over."""
    metadata: dict = field(default_factory=dict)
    """Per-turn facts for metrics (numbers) and debugging."""

    def __post_init__(self) -> None:
        if self.done and self.reward is None:
            raise TaskBug("episode ended with reward None: the environment produced no score")
        if self.reward is not None and not math.isfinite(self.reward):
            raise EnvError(f"reward {self.reward} is not finite")
        for m in self.observations:
            if m.get("role") not in ("tool", "user") or not isinstance(m.get("content"), str):
                raise EnvError(f"observation {m!r}: needs role 'tool' or 'user' and string content")

    def __iter__(self):
        """Unpacks as ``observations, reward, done, metadata``."""
        return iter((self.observations, self.reward, self.done, self.metadata))


@dataclass
class NoConfig:
    """An environment without run-time knobs."""


class Env:
    """One episode against one dataset row. Subclasses set ``name`` and implement ``init`` and ``step``."""

    name: ClassVar[str] = ""
    tools: ClassVar[list[dict]] = []
    """OpenAI-style JSON tool schemas the generator renders in the system prompt."""
    Config: ClassVar[type] = NoConfig
    """Run-time knobs (a dataclass); its keys are ``envs.<name>.<field>``."""
    required_extras: ClassVar[tuple[str, ...]] = ()
    """``env_extras`` keys every row needs; the loader refuses a row without one before anything starts."""

    def __init__(self, extras: dict, config: object | dict | None = None):
        self.extras = extras
        self.config = self.make_config(config)
        self.metrics: dict[str, float] = {}
        """Episode-level numbers the generator reports as ``env/<key>``."""

    @classmethod
    def make_config(cls, config: object | dict | None):
        """``config`` as an instance of ``cls.Config``; unknown keys raise ValueError naming them."""
        if isinstance(config, cls.Config):
            return config
        config = dict(config or {})
        known = {f.name for f in fields(cls.Config)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"envs.{cls.name}.{unknown[0]}: unknown key; known: {', '.join(sorted(known)) or 'none'}")
        return cls.Config(**config)

    def init(self, prompt: list[Message]) -> tuple[list[Message], dict]:
        """The prompt to sample from (possibly rewritten) and metadata. Default: unchanged."""
        return prompt, {}

    def step(self, action: str) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__}.step")

    def close(self) -> None:
        """Release resources (files, connections). Safe to call twice."""

    @classmethod
    def generate_rows(cls, n: int, seed: int, split: str = "train", **knobs) -> list[dict]:
        """``n`` dataset rows (prompt, env_class, env_extras, split, instance_id) drawn with ``seed``."""
        raise NotImplementedError(f"{cls.__name__} has no row generator")

    @classmethod
    def reference_reply(cls, extras: dict) -> str:
        """A correct first reply for ``extras``, in the format the reward reads (SFT demonstrations)."""
        raise NotImplementedError(f"{cls.__name__} has no reference reply")
