"""Evaluation: every held-out prompt once, greedy by default, scored by its environment."""

from __future__ import annotations

import statistics
import time

from megatron_rl.contracts import FAILED, GeneratorInput, PromptItem
from megatron_rl.schedules.components import Components, LoopState


async def greedy_scores(c: Components, prompts: list[PromptItem], step: int, version: int) -> list[float]:
    """Each prompt's reward for one reply at the eval temperature; a rollout whose environment failed every
    attempt scores 0."""
    out = await c.generator.generate(GeneratorInput(prompts, 1, step, version), evaluation=True)
    return [0.0 if t.stop_reason == FAILED else t.reward_sum() for t in out.trajectories]


def pass_rate(scores: list[float]) -> float:
    """Share of replies with full reward."""
    return statistics.fmean(1.0 if s >= 1.0 else 0.0 for s in scores)


async def evaluate(c: Components, state: LoopState) -> dict[str, float]:
    """``eval/*`` metrics over the held-out prompts."""
    if not c.eval_prompts:
        return {}
    start = time.perf_counter()
    scores = await greedy_scores(c, c.eval_prompts, state.step, state.version)
    return {
        "eval/reward_mean": statistics.fmean(scores),
        "eval/pass_rate": pass_rate(scores),
        "eval/num_prompts": float(len(scores)),
        "timing/eval": time.perf_counter() - start,
    }
