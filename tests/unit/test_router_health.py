"""Health probes: a replica leaves rotation after ``health_failures`` failed probes in a row, not after one slow
``/health``; it returns when a probe passes; a quarantined replica never returns."""

import asyncio

import pytest

from megatron_rl.inference.config import RouterConfig
from megatron_rl.inference.router import Router


class Scripted:
    """A replica whose ``/health`` answers follow a script (True: 200)."""

    def __init__(self, url, answers):
        self.url, self.answers = url, list(answers)
        self.healthy, self.quarantined, self.failed_probes, self.capturing_routes = True, False, 0, False
        self.in_flight = self.assigned = 0

    async def is_healthy(self):
        return self.answers.pop(0)


def rotation(answers, failures=3, quarantine=False):
    """``healthy`` after each probe of one replica answering ``answers``."""
    replica = Scripted("http://a", answers)
    router = Router([replica], RouterConfig(health_failures=failures))
    if quarantine:
        router.quarantine("http://a", "test")
    out = []
    for _ in answers:
        asyncio.run(router.probe())
        out.append(replica.healthy)
    return out


def test_one_or_two_failed_probes_keep_a_replica_in_rotation():
    assert rotation([False, False, True, False, True]) == [True] * 5


def test_failures_in_a_row_take_it_out_and_a_passing_probe_brings_it_back():
    assert rotation([False, False, False, False, True, True]) == [True, True, False, False, True, True]
    assert rotation([False, True], failures=1) == [False, True]


def test_a_quarantined_replica_never_returns():
    assert rotation([True, True], quarantine=True) == [False, False]


def test_health_failures_must_be_positive():
    with pytest.raises(ValueError, match="inference.router.health_failures"):
        RouterConfig(health_failures=0)
