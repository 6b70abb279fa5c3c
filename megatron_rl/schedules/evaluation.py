"""Evaluation: every held-out prompt once, greedy by default, scored by its environment."""

from __future__ import annotations

import statistics
import time

from megatron_rl.contracts import FAILED, GeneratorInput
from megatron_rl.schedules.components import Components, LoopState


async def evaluate(c: Components, state: LoopState) -> dict[str, float]:
    """``eval/*`` metrics; a rollout whose environment failed every attempt scores 0."""
    if not c.eval_prompts:
        return {}
    start = time.perf_counter()
    gi = GeneratorInput(c.eval_prompts, 1, state.step, state.version)
    out = await c.generator.generate(gi, evaluation=True)
    scores = [0.0 if t.stop_reason == FAILED else t.reward_sum() for t in out.trajectories]
    return {
        "eval/reward_mean": statistics.fmean(scores),
        "eval/pass_rate": statistics.fmean(1.0 if s >= 1.0 else 0.0 for s in scores),
        "eval/num_prompts": float(len(scores)),
        "timing/eval": time.perf_counter() - start,
    }
