"""``environment/*`` metrics, hand-computed; the token check of the env server."""

import pytest

from megatron_rl.contracts import FAILED, Trajectory, TrajectoryId
from megatron_rl.envs.remote.auth import check_bearer
from megatron_rl.envs.remote.client import RemoteConfig, ws_url
from megatron_rl.generator.env_metrics import environment_metrics


def traj(i, reward, source=None, llm=3.0, env=1.0, failed=False, errors=None, **env_metrics):
    return Trajectory(TrajectoryId("p", i), [1], [2], [0 if failed else 1], reward, [0.0 if failed else -0.1], [0],
                      stop_reason=FAILED if failed else "stop", timing={"llm": llm, "env": env},
                      env_metrics={**env_metrics, **({"env_errors": errors} if errors else {})}, data_source=source)


def test_attempts_replays_failures_time_split_and_score_per_source():
    ts = [traj(0, 1.0, "gsm8k", tool_calls=2.0, unparsed_calls=0.0),
          traj(1, 0.0, "gsm8k", llm=1.0, env=3.0, tool_calls=0.0, unparsed_calls=1.0),
          traj(2, 0.5, "math", tool_calls=1.0, unparsed_calls=0.0),
          traj(3, 0.0, failed=True, errors=2.0)]
    m = environment_metrics(ts, attempts=[1, 2, 1, 2])
    assert m["environment/attempts"] == 1.5 and m["environment/replays"] == 2.0
    # one rollout lost after 2 attempts; one replayed once: 6 attempts, 3 that produced a trajectory
    assert m["environment/failures"] == 1.0 and m["environment/failed_attempts"] == 3.0
    assert m["environment/llm_time"] == pytest.approx(7 / 3) and m["environment/env_time"] == pytest.approx(5 / 3)
    assert m["environment/env_time_fraction"] == pytest.approx(5 / 12)
    assert m["environment/tool_calls"] == 1.0 and m["environment/unparsed_calls"] == pytest.approx(1 / 3)
    assert m["environment/score/gsm8k"] == 0.5 and m["environment/score/math"] == 0.5


@pytest.mark.parametrize("header, status", [(None, 401), ("", 401), ("Basic abc", 401), ("Bearer ", 401),
                                            ("Bearer wrong", 403), ("Bearer tok", None), ("bearer tok", None)])
def test_bearer_check(header, status):
    assert check_bearer(header, "tok") == status
    assert check_bearer(header, None) is None  # no token configured: open


def test_client_config_and_urls():
    assert ws_url("http://h:1/") == "ws://h:1/session" and ws_url("https://h") == "wss://h/session"
    with pytest.raises(ValueError, match=r"envs.remote.reset_deadline_s: must be > 0"):
        RemoteConfig(reset_deadline_s=0)
