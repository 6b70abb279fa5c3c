"""The admission controller against hand-worked traces."""

import pytest

from megatron_rl.schedules.admission import AdmissionController


def _held(a: AdmissionController) -> int:
    """Groups admitted but not yet trained: what the staleness budget bounds."""
    return a.counts.accepted - a.counts.consumed + a.counts.running


def _submit_all(a: AdmissionController) -> list[int]:
    steps = []
    while a.can_submit():
        steps.append(a.submit())
        assert _held(a) <= a.batch_groups * (a.staleness + 1)
    return steps


def test_long_group_trains_with_lag_three_and_counts_one_violation():
    # B=1, S=2. Step 1 admits (2+1)*1 = 3 groups: A (long), X, Y, all scheduled at step 1.
    a = AdmissionController(batch_groups=1, staleness=2, max_running=8)
    assert _submit_all(a) == [1, 1, 1]
    a.complete()  # X
    a.complete()  # Y
    assert a.consume([1]) == [0]  # step 1 trains X
    a.finish_step()
    assert _submit_all(a) == [2]  # capacity 4: accepted 2 + running 2 (A, Z) -> full
    assert a.consume([1]) == [1]  # step 2 trains Y (lag 1)
    a.finish_step()
    a.complete()  # Z
    assert _submit_all(a) == [3]  # capacity 5: accepted 3 + running 2 (A, W)
    assert a.consume([2]) == [1]  # step 3 trains Z
    a.finish_step()
    a.complete()  # A, the long one, at last
    assert a.consume([1]) == [3]  # step 4 trains A: lag 3 > S
    assert a.counts.violations == 1
    assert a.counts.lag_histogram == {0: 1, 1: 2, 3: 1}
    assert _held(a) <= 3
    assert (a.counts.submitted, a.counts.accepted, a.counts.running) == (5, 4, 1)


def test_zero_staleness_never_runs_ahead_of_its_update():
    # S=0, B=2: exactly one mini-batch may be in flight; every group trains at the step it was scheduled.
    a = AdmissionController(batch_groups=2, staleness=0, max_running=16)
    for step in range(1, 6):
        scheduled = _submit_all(a)
        assert scheduled == [step, step]
        for _ in scheduled:
            a.complete()
        assert not a.can_submit()  # nothing for step + 1 before step is trained
        assert a.consume(scheduled) == [0, 0]
        a.finish_step()
    assert a.counts.violations == 0 and a.counts.lag_histogram == {0: 10}


def test_filtering_frees_capacity_where_producers_would_block_forever():
    # B=2, S=0: two groups complete with zero reward variance. Kept as accepted, they fill the step's
    # capacity, so no group can start, and the trainer (which needs two useful groups) waits forever.
    stuck = AdmissionController(batch_groups=2, staleness=0, max_running=4)
    _submit_all(stuck)
    stuck.complete()
    stuck.complete()
    assert not stuck.can_submit() and stuck.counts.running == 0

    freed = AdmissionController(batch_groups=2, staleness=0, max_running=4)
    _submit_all(freed)
    freed.complete()
    freed.complete()
    freed.filter(2)  # the same two groups, reclassified
    assert _submit_all(freed) == [1, 1]
    assert (freed.counts.submitted, freed.counts.accepted, freed.counts.filtered, freed.counts.running) == (4, 0, 2, 2)


def test_worker_limit_caps_running_groups():
    a = AdmissionController(batch_groups=4, staleness=2, max_running=3)
    assert len(_submit_all(a)) == 3
    a.complete()
    assert len(_submit_all(a)) == 1


def test_failed_group_is_filtered_on_completion():
    a = AdmissionController(batch_groups=1, staleness=0, max_running=2)
    a.submit()
    a.complete(kept=False)
    assert a.can_submit() and a.counts.filtered == 1 and a.counts.accepted == 0


def test_hard_lag_cap_drops_an_old_group_and_frees_its_place():
    a = AdmissionController(batch_groups=1, staleness=1, max_running=4, max_lag=1)
    _submit_all(a)  # two groups at step 1
    a.complete()
    a.consume([1])
    a.finish_step()
    a.finish_step()  # the trainer moved on (e.g. a step trained from elsewhere): now at step 3
    a.complete()
    assert a.over_lag_cap(1)  # lag 2 > max_lag 1
    a.filter()
    assert (a.counts.filtered, a.buffered) == (1, 0) and a.can_submit()
    assert not a.over_lag_cap(2)


def test_resume_drops_groups_that_died_with_the_process():
    a = AdmissionController(batch_groups=2, staleness=1, max_running=8)
    _submit_all(a)  # 4 groups at step 1
    a.complete()
    a.complete()
    a.complete()
    a.consume([1, 1])
    a.finish_step()
    a.filter(1)
    counts = AdmissionController.counts_from(a.state_dict())
    # 1 filtered + 2 consumed survive; 1 running was lost; the filtered one stays filtered
    assert (counts.submitted, counts.accepted, counts.filtered, counts.running, counts.consumed) == (3, 2, 1, 0, 2)
    assert counts.step == 2 and counts.lag_histogram == {0: 2}
    AdmissionController(2, 1, 8, counts=counts)  # the invariant holds


def test_rejects_bad_settings_with_names():
    with pytest.raises(ValueError, match="batch_groups"):
        AdmissionController(batch_groups=0, staleness=1, max_running=1)
    with pytest.raises(ValueError, match="max_lag"):
        AdmissionController(batch_groups=1, staleness=2, max_running=1, max_lag=1)
