"""Per-replica request statistics and the server's own prefix-cache counters."""

from __future__ import annotations

import re
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

_COUNTER = re.compile(r"^(vllm:prefix_cache_(?:hits|queries)_total)\{[^}]*\}\s+([0-9.eE+-]+)$", re.M)


@dataclass
class ReplicaStats:
    """Counters a replica's client keeps; ``window`` recent latencies give the percentiles."""

    window: int = 1024
    requests: int = 0
    failures: int = 0
    completion_tokens: int = 0
    latencies: deque = field(default_factory=deque)
    _mark_time: float = field(default_factory=time.monotonic)
    _mark_tokens: int = 0

    def record(self, latency_s: float, completion_tokens: int) -> None:
        self.requests += 1
        self.completion_tokens += completion_tokens
        self.latencies.append(latency_s)
        if len(self.latencies) > self.window:
            self.latencies.popleft()

    def tokens_per_s(self) -> float:
        """Completion tokens per second since the previous call."""
        now = time.monotonic()
        rate = (self.completion_tokens - self._mark_tokens) / max(now - self._mark_time, 1e-9)
        self._mark_time, self._mark_tokens = now, self.completion_tokens
        return rate

    def snapshot(self) -> dict[str, float]:
        lat = sorted(self.latencies)
        return {
            "requests": self.requests,
            "failures": self.failures,
            "completion_tokens": self.completion_tokens,
            "tokens_per_s": self.tokens_per_s(),
            "latency_mean_s": statistics.fmean(lat) if lat else 0.0,
            "latency_p50_s": lat[len(lat) // 2] if lat else 0.0,
            "latency_p99_s": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0,
        }


def prefix_cache_counters(prometheus_text: str) -> tuple[float, float] | None:
    """(hits, queries) in tokens from a vLLM ``/metrics`` page, summed over engines; None if absent."""
    totals: dict[str, float] = {}
    for name, value in _COUNTER.findall(prometheus_text):
        totals[name] = totals.get(name, 0.0) + float(value)
    if len(totals) < 2:
        return None
    return totals["vllm:prefix_cache_hits_total"], totals["vllm:prefix_cache_queries_total"]


def fleet_metrics(per_replica: dict[str, dict[str, float]]) -> dict[str, float]:
    """Flatten to ``inference/<name>`` (fleet totals) and ``inference/replica<i>/<name>``."""
    out: dict[str, float] = {}
    for i, stats in enumerate(per_replica.values()):
        for name, value in stats.items():
            out[f"inference/replica{i}/{name}"] = value
    for name in ("in_flight", "requests", "failures", "completion_tokens", "tokens_per_s"):
        out[f"inference/{name}"] = sum(s.get(name, 0.0) for s in per_replica.values())
    hits = sum(s.get("prefix_cache_hits", 0.0) for s in per_replica.values())
    queries = sum(s.get("prefix_cache_queries", 0.0) for s in per_replica.values())
    if queries:
        out["inference/prefix_cache_hit_rate"] = hits / queries
    return out
