"""Routing policies: least loaded, round robin, sticky sessions and their moves."""

from dataclasses import dataclass

import pytest

from megatron_rl.inference.policies import LeastLoaded, RoundRobin, StickyLeastLoaded, make_policy


@dataclass(eq=False)
class R:
    url: str
    in_flight: int = 0
    assigned: int = 0


def test_least_loaded_takes_fewest_in_flight_then_fewest_assigned():
    a, b, c = R("a", 2, 0), R("b", 1, 5), R("c", 1, 3)
    assert LeastLoaded().choose([a, b, c], None) is c


def test_round_robin_cycles_over_candidates():
    reps = [R("a"), R("b"), R("c")]
    policy = RoundRobin()
    assert [policy.choose(reps, "s").url for _ in range(4)] == ["a", "b", "c", "a"]


def test_sticky_first_turn_least_loaded_later_turns_stay_even_when_loaded():
    a, b = R("a", 0), R("b", 3)
    policy = StickyLeastLoaded()
    assert policy.choose([a, b], "s1") is a
    a.in_flight = 10
    assert policy.choose([a, b], "s1") is a
    assert policy.choose([a, b], "s2") is b


def test_sticky_session_moves_when_its_replica_leaves_and_stays_moved():
    a, b = R("a", 0), R("b", 5)
    policy = StickyLeastLoaded()
    assert policy.choose([a, b], "s") is a
    assert policy.choose([b], "s") is b
    assert policy.choose([a, b], "s") is b


def test_sticky_forgets_oldest_sessions_beyond_its_cap():
    a, b = R("a"), R("b")
    policy = StickyLeastLoaded(max_sessions=2)
    policy.choose([a, b], "s1")
    a.in_flight = 1
    policy.choose([a, b], "s2")
    policy.choose([a, b], "s3")
    b.in_flight = 9
    assert policy.choose([a, b], "s1") is a  # forgotten, placed afresh
    assert policy.choose([a, b], "s3") is b


def test_unknown_policy_names_the_key():
    with pytest.raises(ValueError, match="inference.router.policy"):
        make_policy("random")
