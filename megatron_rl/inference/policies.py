"""Routing policies: which replica gets a request. Pure; the router and the HTTP proxy share them."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class Load(Protocol):
    """What a policy may read about a replica."""

    url: str
    in_flight: int
    assigned: int


def least_loaded(candidates: list[Load]) -> Load:
    """Fewest in-flight requests; ties go to the replica that was given fewer requests so far."""
    return min(candidates, key=lambda r: (r.in_flight, r.assigned))


class RoundRobin:
    """Each request to the next candidate in turn."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, candidates: list[Load], session_id: str | None) -> Load:
        replica = candidates[self._next % len(candidates)]
        self._next += 1
        return replica


class LeastLoaded:
    """Each request to the candidate with the fewest in-flight requests."""

    def choose(self, candidates: list[Load], session_id: str | None) -> Load:
        return least_loaded(candidates)


class StickyLeastLoaded:
    """A session's first request goes to the least-loaded candidate; its later turns follow it there.

    When the session's replica is not a candidate (out of rotation, or already tried for this
    request), the session moves to the least-loaded candidate and stays there from then on.
    """

    def __init__(self, max_sessions: int = 1_000_000) -> None:
        self._home: OrderedDict[str, str] = OrderedDict()
        self._max_sessions = max_sessions

    def choose(self, candidates: list[Load], session_id: str | None) -> Load:
        if session_id is None:
            return least_loaded(candidates)
        home = self._home.get(session_id)
        replica = next((r for r in candidates if r.url == home), None) or least_loaded(candidates)
        self._home[session_id] = replica.url
        self._home.move_to_end(session_id)
        if len(self._home) > self._max_sessions:
            self._home.popitem(last=False)
        return replica

    def forget(self, session_id: str) -> None:
        """Drop a finished session's placement."""
        self._home.pop(session_id, None)


def make_policy(name: str):
    """The policy registered under ``inference.router.policy``."""
    policies = {"sticky_least_loaded": StickyLeastLoaded, "least_loaded": LeastLoaded, "round_robin": RoundRobin}
    if name not in policies:
        raise ValueError(f"inference.router.policy: {name!r} is not one of {tuple(policies)}")
    return policies[name]()
