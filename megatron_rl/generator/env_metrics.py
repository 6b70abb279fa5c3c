"""``environment/*`` metrics of a batch: attempts and replays, failures, tool calls, time split, score per source."""

from __future__ import annotations

import statistics
from collections import defaultdict

from megatron_rl.contracts import FAILED, Trajectory


def environment_metrics(trajectories: list[Trajectory], attempts: list[int]) -> dict[str, float]:
    """``attempts[i]``: tries trajectory ``i`` took (1 = no replay). Scores are grouped by the row's
    ``data_source`` (the key veRL and SkyRL route verifiers by)."""
    live = [t for t in trajectories if t.stop_reason != FAILED]
    lost = [t for t in trajectories if t.stop_reason == FAILED and t.env_metrics.get("env_errors")]
    """Rollouts that failed every attempt (their placeholders carry the error count)."""
    metrics = {
        "environment/attempts": statistics.fmean(attempts) if attempts else 0.0,
        "environment/replays": float(sum(a - 1 for a in attempts)),
        "environment/failures": float(len(lost)),
        "environment/failed_attempts": float(sum(attempts) - (len(trajectories) - len(lost))),
    }
    if not live:
        return metrics
    llm = statistics.fmean(t.timing.get("llm", 0.0) for t in live)
    env = statistics.fmean(t.timing.get("env", 0.0) for t in live)
    metrics.update({"environment/llm_time": llm, "environment/env_time": env,
                    "environment/env_time_fraction": env / (llm + env) if llm + env > 0 else 0.0})
    for key in ("tool_calls", "unparsed_calls"):
        if any(key in t.env_metrics for t in live):
            metrics[f"environment/{key}"] = statistics.fmean(t.env_metrics.get(key, 0.0) for t in live)
    by_source: dict[str, list[float]] = defaultdict(list)
    for t in live:
        if t.data_source:
            by_source[t.data_source].append(t.reward_sum())
    for source, scores in by_source.items():
        metrics[f"environment/score/{source}"] = statistics.fmean(scores)
    return metrics
