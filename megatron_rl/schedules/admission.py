"""Admission control for the fully asynchronous schedule: when may a new group start?

Steps are counted from 1: step ``s`` is the optimizer step the trainer is working towards, taken
with weights version ``s - 1``; a group submitted while the trainer is at step ``s`` is *scheduled*
at ``s`` (its ``group_step``). With mini-batch size ``B`` (groups) and staleness budget ``S``, a new
group starts only while

    accepted + running < (S + s) * B      and      running < max_running

where ``accepted`` counts every group that completed and was kept (consumed or still buffered).
The counts always satisfy ``submitted = accepted + filtered + running``; a group filtered after it
completed (zero reward variance, failed environment, over the hard lag cap) moves from accepted to
filtered and so frees its capacity. The bound is aggregate: a slow group may still be consumed at a
step more than ``S`` after it was scheduled; it is trained and counted as a violation.

Pure bookkeeping, no I/O, no clocks: the schedule calls it at each event, tests replay traces.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class AdmissionCounts:
    """What the controller has seen; checkpointed so that a resumed run keeps its accounting."""

    step: int = 1
    """The optimizer step the trainer works towards (1-based)."""
    submitted: int = 0
    running: int = 0
    accepted: int = 0
    """Completed and kept: consumed or still buffered."""
    filtered: int = 0
    consumed: int = 0
    violations: int = 0
    """Consumed groups whose lag exceeded the staleness budget."""
    lag_histogram: dict[int, int] = field(default_factory=dict)
    """Lag (training step - scheduled step) -> consumed groups."""


class AdmissionController:
    """Counts groups through submit → complete → (filter | consume) and answers :meth:`can_submit`."""

    def __init__(self, batch_groups: int, staleness: int, max_running: int, max_lag: int | None = None,
                 counts: AdmissionCounts | None = None):
        if batch_groups < 1 or staleness < 0 or max_running < 1:
            raise ValueError(f"admission: need batch_groups >= 1, staleness >= 0, max_running >= 1; "
                             f"got {batch_groups}, {staleness}, {max_running}")
        if max_lag is not None and max_lag < staleness:
            raise ValueError(f"admission: max_lag ({max_lag}) must be >= staleness ({staleness}) or None")
        self.batch_groups, self.staleness, self.max_running, self.max_lag = batch_groups, staleness, max_running, max_lag
        self.counts = counts or AdmissionCounts()
        self._check()

    @property
    def capacity(self) -> int:
        """How many groups may have been accepted or be running at the current step."""
        return (self.staleness + self.counts.step) * self.batch_groups

    @property
    def buffered(self) -> int:
        """Accepted groups not yet consumed."""
        return self.counts.accepted - self.counts.consumed

    def can_submit(self) -> bool:
        c = self.counts
        return c.accepted + c.running < self.capacity and c.running < self.max_running

    def submit(self) -> int:
        """Start one group; returns its scheduled step. Call only when :meth:`can_submit`."""
        assert self.can_submit(), "admission: submit() without capacity"
        self.counts.submitted += 1
        self.counts.running += 1
        self._check()
        return self.counts.step

    def complete(self, kept: bool = True) -> None:
        """A running group finished: kept (accepted) or filtered at once (e.g. its environment failed)."""
        assert self.counts.running > 0, "admission: complete() with nothing running"
        self.counts.running -= 1
        if kept:
            self.counts.accepted += 1
        else:
            self.counts.filtered += 1
        self._check()

    def filter(self, groups: int = 1) -> None:
        """Buffered groups found useless after completion move from accepted to filtered."""
        assert self.buffered >= groups, "admission: filter() more groups than are buffered"
        self.counts.accepted -= groups
        self.counts.filtered += groups
        self._check()

    def over_lag_cap(self, group_step: int) -> bool:
        """Whether a buffered group scheduled at ``group_step`` is too old to train now (the optional
        hard per-group cap; the caller then :meth:`filter` s it)."""
        return self.max_lag is not None and self.counts.step - group_step > self.max_lag

    def consume(self, group_steps: list[int]) -> list[int]:
        """The trainer takes buffered groups for the current step; returns their lags."""
        assert len(group_steps) <= self.buffered, "admission: consume() more groups than are buffered"
        lags = [self.counts.step - s for s in group_steps]
        assert all(lag >= 0 for lag in lags), f"admission: a group from the future ({group_steps} at {self.counts.step})"
        self.counts.consumed += len(lags)
        self.counts.violations += sum(lag > self.staleness for lag in lags)
        hist = Counter(self.counts.lag_histogram) + Counter(lags)
        self.counts.lag_histogram = dict(sorted(hist.items()))
        return lags

    def finish_step(self) -> None:
        """The trainer took step ``s``; capacity grows by one mini-batch."""
        self.counts.step += 1

    def metrics(self) -> dict[str, float]:
        c = self.counts
        out = {f"async/{k}": float(getattr(c, k)) for k in ("submitted", "accepted", "filtered", "running", "consumed", "violations")}
        out["async/buffer_size"] = float(self.buffered)
        out.update({f"async/lag_hist/{lag}": float(n) for lag, n in c.lag_histogram.items()})
        return out

    def state_dict(self) -> dict:
        return asdict(self.counts)

    @staticmethod
    def counts_from(state: dict) -> AdmissionCounts:
        """Counts from a checkpoint. Groups running or buffered when it was written died with the
        process and their prompts are generated again, so they are taken back out of the counts."""
        c = AdmissionCounts(**{**state, "lag_histogram": {int(k): v for k, v in state["lag_histogram"].items()}})
        lost = c.accepted - c.consumed
        c.submitted -= c.running + lost
        c.accepted -= lost
        c.running = 0
        return c

    def _check(self) -> None:
        c = self.counts
        assert c.submitted == c.accepted + c.filtered + c.running, f"admission invariant broken: {c}"
        assert min(c.running, c.accepted, c.filtered, c.consumed) >= 0 and c.consumed <= c.accepted, f"admission: {c}"
