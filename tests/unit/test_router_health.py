"""Health probes: a replica leaves rotation after ``health_failures`` failed probes in a row, not after one slow
``/health``; it returns when a probe passes; a quarantined replica never returns. A request that finds no
replica in rotation waits up to ``rotation_wait_s`` for one to return."""

import asyncio

import pytest

from megatron_rl.inference.config import RouterConfig
from megatron_rl.inference.router import NoReplicaError, Router


class Scripted:
    """A replica whose ``/health`` answers follow a script (True: 200)."""

    def __init__(self, url, answers):
        self.url, self.answers = url, list(answers)
        self.healthy, self.quarantined, self.failed_probes, self.capturing_routes = True, False, 0, False
        self.in_flight = self.assigned = 0

    async def is_healthy(self):
        return self.answers.pop(0)

    async def complete(self, payload, headers, timeout_s, path):
        return {"echo": payload}, 0.01


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


def send_while_out(probes_until_back, wait_s, quarantine=False):
    """Send one request while the only replica is out of rotation and the probe loop runs every 10 ms; the
    replica's probes fail ``probes_until_back`` times and then pass. Returns (body or error, seconds)."""
    replica = Scripted("http://a", [False] * probes_until_back + [True] * 1000)
    router = Router([replica], RouterConfig(health_interval_s=0.01, rotation_wait_s=wait_s))
    router.take_out(replica, "loading weights")
    if quarantine:
        router.quarantine("http://a", "test")

    async def body():
        router.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            out = (await router.send({"prompt": [1]}, None))[0]
        except NoReplicaError as err:
            out = err
        finally:
            await router.stop()
        return out, loop.time() - start

    return asyncio.run(body())


def test_a_request_waits_for_a_replica_to_come_back_into_rotation():
    out, took = send_while_out(probes_until_back=5, wait_s=30)
    assert out == {"echo": {"prompt": [1]}}
    assert 0.04 <= took < 5


def test_without_a_rotation_wait_or_past_it_a_request_fails_naming_no_attempt():
    for wait_s in (0, 0.05):
        out, took = send_while_out(probes_until_back=10_000, wait_s=wait_s)
        assert isinstance(out, NoReplicaError) and "after 0 attempt(s)" in str(out)
        assert took < 2


def test_an_all_quarantined_fleet_fails_at_once_however_long_the_wait():
    out, took = send_while_out(probes_until_back=0, wait_s=30, quarantine=True)
    assert isinstance(out, NoReplicaError)
    assert took < 1


def test_rotation_wait_must_not_be_negative():
    with pytest.raises(ValueError, match="inference.router.rotation_wait_s"):
        RouterConfig(rotation_wait_s=-1)
