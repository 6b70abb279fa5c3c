"""``gridsim``: schedule a grid battery over a day of hourly prices; scored against the day's exact optimum.

Score of a submitted schedule (see ``battery.score``): 0 if it breaks a rule (wrong length, unknown action,
charging a full or selling an empty battery), else ``clip(0.2 + 0.8 * profit / optimum, 0, 1)``, so idling all
day scores 0.2, the optimum 1, and losing a quarter of the optimum or more scores 0.

Multi-turn: each ``submit_schedule`` call gets feedback (profit, violations, score) and may be revised. A turn's
reward is its improvement over the best score so far, so the rewards of an episode sum to its best score. The
episode ends at the optimum, at ``max_turns``, or when the model replies without a tool call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from megatron_rl.envs.base import Env, StepResult, TaskBug
from megatron_rl.envs.gridsim.battery import ACTIONS, optimum, score, simulate
from megatron_rl.envs.registry import register_env
from megatron_rl.envs.tool_calls import PARSERS, parse_tool_calls

SUBMIT = {"type": "function", "function": {
    "name": "submit_schedule",
    "description": "Submit the battery schedule for the day: one action per hour, hour 0 first.",
    "parameters": {"type": "object", "properties": {"schedule": {
        "type": "array", "items": {"type": "string", "enum": list(ACTIONS)},
        "description": "One of charge, sell, idle for every hour."}}, "required": ["schedule"]},
}}
_SHORT = {"c": "charge", "s": "sell", "i": "idle"}


@dataclass
class GridSimConfig:
    """``envs.gridsim.*``: limits of one episode."""

    max_turns: int = 3
    """Submissions before the episode ends."""
    tool_call_format: str = "hermes"
    """Tool-call syntax the policy writes (hermes or qwen3_coder)."""

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"envs.gridsim.max_turns: must be >= 1, got {self.max_turns}")
        if self.tool_call_format not in PARSERS:
            raise ValueError(f"envs.gridsim.tool_call_format: '{self.tool_call_format}'; known: {', '.join(PARSERS)}")


def read_schedule(value) -> list[str] | None:
    """A list of actions from a JSON list or a comma/space separated string; ``c``/``s``/``i`` abbreviate."""
    if isinstance(value, str):
        value = [v for v in re.split(r"[\s,]+", value) if v]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return [_SHORT.get(v.strip().lower(), v.strip().lower()) for v in value]


@register_env
class GridSimEnv(Env):
    """Battery arbitrage over ``extras["prices"]`` with ``extras["capacity"]`` units, starting at ``extras.get("start", 0)``."""

    name = "gridsim"
    tools = [SUBMIT]
    Config = GridSimConfig
    required_extras = ("prices", "capacity")

    def __init__(self, extras: dict, config=None):
        super().__init__(extras, config)
        if "prices" not in extras or "capacity" not in extras:
            raise ValueError(f"env_extras for env_class 'gridsim': needs 'prices' and 'capacity' (got {sorted(extras)})")
        self.prices, self.capacity, self.start = list(extras["prices"]), int(extras["capacity"]), int(extras.get("start", 0))
        self.optimum, _ = optimum(self.prices, self.capacity, self.start)
        if self.optimum <= 0:
            raise TaskBug("gridsim day has no profitable schedule, so score = profit / optimum is undefined")
        self.turns, self.best = 0, 0.0
        self.metrics = {"best_score": 0.0, "submissions": 0.0, "invalid": 0.0, "parse_errors": 0.0}

    def step(self, action: str) -> StepResult:
        self.turns += 1
        parsed = parse_tool_calls(action, self.config.tool_call_format)
        if parsed.error:
            self.metrics["parse_errors"] += 1
            return self._reply(f"Your tool call could not be parsed: {parsed.error}", 0.0)
        if not parsed.calls and not self.metrics["submissions"]:
            return self._reply("No schedule submitted yet: call submit_schedule with one action per hour.", 0.0)
        if not parsed.calls:
            return StepResult([], 0.0, True, {"best_score": self.best})
        call = parsed.calls[0]
        if call.name != "submit_schedule":
            return self._reply(f"Unknown tool '{call.name}'; the only tool is submit_schedule.", 0.0)
        schedule = read_schedule(call.arguments.get("schedule"))
        if schedule is None:
            return self._reply("submit_schedule needs 'schedule': a list of charge/sell/idle, one per hour.", 0.0)
        return self._judge(schedule)

    def _judge(self, schedule: list[str]) -> StepResult:
        profit, violations = simulate(schedule, self.prices, self.capacity, self.start)
        s = score(profit, violations, self.optimum)
        reward, self.best = max(0.0, s - self.best), max(self.best, s)
        self.metrics.update(best_score=self.best, submissions=self.metrics["submissions"] + 1)
        self.metrics["invalid"] += float(bool(violations))
        if violations:
            text = "Invalid schedule (score 0): " + "; ".join(violations[:5])
        else:
            text = f"Valid schedule. Profit {profit:g}, score {s:.3f} of 1."
        if s >= 1.0:
            return StepResult([], reward, True, {"score": s, "best_score": self.best})
        return self._reply(text + " Revise with submit_schedule, or reply without a tool call to finish.", reward)

    def _reply(self, text: str, reward: float) -> StepResult:
        done = self.turns >= self.config.max_turns
        return StepResult([] if done else [{"role": "tool", "content": text}], reward, done, {"best_score": self.best})

    @classmethod
    def generate_rows(cls, n: int, seed: int, split: str = "train", **knobs) -> list[dict]:
        from megatron_rl.envs.gridsim.tasks import generate_rows

        return generate_rows(n, seed, split, **knobs)

    @classmethod
    def reference_reply(cls, extras: dict) -> str:
        _, plan = optimum(list(extras["prices"]), int(extras["capacity"]), int(extras.get("start", 0)))
        call = {"name": "submit_schedule", "arguments": {"schedule": plan}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
