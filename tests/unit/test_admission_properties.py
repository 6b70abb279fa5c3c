"""The admission controller's invariant and bound under random completion orders (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_rl.schedules.admission import AdmissionController


@settings(max_examples=200, deadline=None)
@given(
    batch_groups=st.integers(1, 4),
    staleness=st.integers(0, 3),
    max_running=st.integers(1, 12),
    events=st.lists(st.tuples(st.sampled_from(["submit", "complete", "train"]), st.integers(0, 2**16), st.booleans()),
                    max_size=120),
)
def test_counts_stay_consistent_and_bounded(batch_groups, staleness, max_running, events):
    a = AdmissionController(batch_groups, staleness, max_running)
    running: list[int] = []  # scheduled steps of running groups, completed in random order
    buffered: list[int] = []
    for kind, pick, keep in events:
        if kind == "submit" and a.can_submit():
            running.append(a.submit())
        elif kind == "complete" and running:
            step = running.pop(pick % len(running))
            a.complete(kept=True)
            if keep:
                buffered.append(step)
            else:  # zero reward variance: reclassified after completion
                a.filter()
        elif kind == "train" and len(buffered) >= batch_groups:
            taken, buffered = buffered[:batch_groups], buffered[batch_groups:]
            lags = a.consume(taken)
            assert all(lag >= 0 for lag in lags)
            a.finish_step()
        c = a.counts
        assert c.submitted == c.accepted + c.filtered + c.running
        assert c.running == len(running) <= max_running
        assert a.buffered == len(buffered)
        # admitted but untrained groups never exceed B (S + 1): the staleness budget, in aggregate
        assert c.accepted - c.consumed + c.running <= batch_groups * (staleness + 1)
    assert a.counts.violations == sum(n for lag, n in a.counts.lag_histogram.items() if lag > staleness)


@settings(max_examples=100, deadline=None)
@given(batch_groups=st.integers(1, 4), staleness=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_filtering_never_deadlocks(batch_groups, staleness, seed):
    """Whatever share of groups is filtered, producers can always start a group while the trainer
    lacks a full mini-batch and nothing is running."""
    import random

    rng = random.Random(seed)
    a = AdmissionController(batch_groups, staleness, max_running=batch_groups)
    buffered: list[int] = []
    for _ in range(200):
        if len(buffered) >= batch_groups:
            a.consume(buffered[:batch_groups])
            buffered = buffered[batch_groups:]
            a.finish_step()
            continue
        assert a.can_submit() or a.counts.running > 0
        while a.can_submit():
            step = a.submit()
            a.complete()
            if rng.random() < 0.7:
                a.filter()
            else:
                buffered.append(step)
