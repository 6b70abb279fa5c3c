"""Per-token and per-trajectory lag of a trained batch, against hand-computed values."""

import torch

from megatron_rl.contracts import Trajectory, TrainingBatch, TrajectoryId
from megatron_rl.schedules.lag import lag_metrics, token_lags
from megatron_rl.schedules.ppo_update import mini_batches


def _trajectory(versions: list[int], mask: list[int], name: str = "p") -> Trajectory:
    n = len(versions)
    return Trajectory(TrajectoryId(name, 0), [1, 2], [5] * n, mask, 1.0, [-0.5 if m else 0.0 for m in mask], versions)


def test_token_lags_count_sampled_tokens_only():
    # a turn sampled with version 1, an observation (mask 0), a turn resumed after a sync with version 2
    t = _trajectory([1, 1, 1, 2, 2], [1, 1, 0, 1, 1])
    assert token_lags(t, trainer_version=3) == [2, 2, 1, 1]


def test_lag_metrics_by_trajectory_and_token():
    mixed = _trajectory([1, 1, 1, 2, 2], [1, 1, 0, 1, 1], "a")  # lags 2 2 1 1: staleness 2
    fresh = _trajectory([3, 3], [1, 1], "b")  # lags 0 0: staleness 0
    m = lag_metrics([mixed, fresh], trainer_version=3)
    assert m["async/staleness_mean"] == 1.0 and m["async/staleness_max"] == 2.0 and m["async/staleness_min"] == 0.0
    assert m["async/token_lag_mean"] == (2 + 2 + 1 + 1 + 0 + 0) / 6
    assert m["async/multi_version_trajectories"] == 1.0
    assert {k: v for k, v in m.items() if "hist" in k} == {
        "async/token_lag_hist/0": 2.0, "async/token_lag_hist/1": 2.0, "async/token_lag_hist/2": 2.0}


def test_mini_batches_keep_groups_whole_and_in_order():
    rows = 7
    batch = TrainingBatch(
        input_ids=torch.ones(rows, 3, dtype=torch.long), attention_mask=torch.ones(rows, 3),
        loss_mask=torch.tensor([[0.0, 1, 1]] * rows), advantages=torch.zeros(rows, 3), rollout_logprobs=torch.zeros(rows, 3),
        group_ids=torch.tensor([0, 0, 1, 1, 1, 2, 3]), trajectory_ids=[f"t{i}" for i in range(rows)],
        prompt_lengths=torch.ones(rows, dtype=torch.long),
    )
    assert mini_batches(batch, 2) == [[0, 1, 2, 3, 4], [5, 6]]
    assert mini_batches(batch, 3) == [[0, 1, 2, 3, 4, 5], [6]]
    assert mini_batches(batch, 0) == [list(range(7))]
