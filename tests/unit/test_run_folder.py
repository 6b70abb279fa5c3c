"""The run folder keeps metrics and ledger lines; a second run into it needs resume."""

import math

import pytest

from megatron_rl.contracts import Trajectory, TrajectoryId
from megatron_rl.run_folder import RunFolder


def test_metrics_and_trajectories_are_appended(tmp_path):
    folder = RunFolder(tmp_path / "r", resume=False)
    folder.log_metrics(0, {"reward/mean": 0.5, "timing/step": 1.0})
    folder.log_metrics(1, {"reward/mean": 0.75})
    t = Trajectory(TrajectoryId("a", 0), [1, 2], [3], [1], 1.0, [-0.1], [0])
    folder.log_trajectories([t])
    assert [m["reward/mean"] for m in folder.read_metrics()] == [0.5, 0.75]
    assert (tmp_path / "r" / "trajectories.jsonl").read_text().count("\n") == 1


@pytest.mark.parametrize("name,value", [("Reward", 1.0), ("reward", 1.0), ("reward/mean", math.nan), ("x/y", "1")])
def test_bad_metric_names_and_values(tmp_path, name, value):
    with pytest.raises(ValueError):
        RunFolder(tmp_path, resume=False).log_metrics(0, {name: value})


def test_existing_run_needs_resume(tmp_path):
    RunFolder(tmp_path, resume=False).log_metrics(0, {"reward/mean": 0.0})
    with pytest.raises(ValueError, match="run.resume=latest"):
        RunFolder(tmp_path, resume=False)
    RunFolder(tmp_path, resume=True)
