"""The end-of-run summary: held-out eval before → after and best, train reward, wall time per phase, where things are."""

from __future__ import annotations

import statistics
from pathlib import Path

from megatron_rl.console import format_seconds

# Seconds each RL step spends per phase (summed from metrics.jsonl), in print order.
_STEP_PHASES = (("timing/generate", "generate"), ("timing/train", "train"), ("timing/weight_sync", "sync"),
                ("timing/eval", "eval"))


def summary_lines(records: list[dict], phases: dict[str, float], root: Path, curves: Path) -> list[str]:
    """A few lines a person reads at the end of a run."""
    lines = []
    evals = [(r["step"], r["eval/pass_rate"]) for r in records if "eval/pass_rate" in r]
    if evals:
        (first_step, first), (last_step, last) = evals[0], evals[-1]
        best_step, best = max(evals, key=lambda e: (e[1], -e[0]))
        lines.append(f"eval pass rate: {first:.3f} (step {first_step}) -> {last:.3f} (step {last_step}), "
                     f"{100 * (last - first):+.1f} points; best {best:.3f} at step {best_step}")
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    if rewards:
        k = min(5, len(rewards))
        lines.append(f"train reward: {statistics.fmean(rewards[:k]):.3f} (first {k} steps) -> "
                     f"{statistics.fmean(rewards[-k:]):.3f} (last {k})")
    spent = {label: sum(r.get(key, 0.0) for r in records) for key, label in _STEP_PHASES}
    inner = ", ".join(f"{label} {format_seconds(s)}" for label, s in spent.items() if s)
    outer = ", ".join(f"{name} {format_seconds(s)}" for name, s in phases.items())
    lines.append(f"wall time: {outer}" + (f" (RL steps: {inner})" if inner else ""))
    checkpoints = root / "checkpoints"
    lines.append(f"run folder: {root} (metrics.jsonl, trajectories.jsonl)")
    lines.append(f"curves: {curves}")
    if checkpoints.exists():
        lines.append(f"checkpoints: {checkpoints}")
    return lines
