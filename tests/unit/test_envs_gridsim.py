"""gridsim: the DP optimum against brute force, the score formula, and multi-turn revision."""

import itertools
import json
import random

import pytest

from megatron_rl.envs import TaskBug, make_env
from megatron_rl.envs.gridsim import generate_rows
from megatron_rl.envs.gridsim.battery import ACTIONS, optimum, score, simulate


def _brute_force(prices, capacity, start):
    best = None
    for plan in itertools.product(ACTIONS, repeat=len(prices)):
        profit, violations = simulate(list(plan), prices, capacity, start)
        if not violations:
            best = profit if best is None else max(best, profit)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_dp_optimum_equals_brute_force(seed):
    rng = random.Random(seed)
    prices = [rng.randint(1, 20) for _ in range(7)]
    capacity, start = rng.randint(1, 3), rng.randint(0, 1)
    best, plan = optimum(prices, capacity, start)
    assert best == _brute_force(prices, capacity, start)
    assert simulate(plan, prices, capacity, start) == (best, [])


def test_simulate_by_hand():
    assert simulate(["charge", "idle", "sell"], [3, 9, 10], 1) == (7, [])
    assert simulate(["sell", "idle", "idle"], [3, 9, 10], 1)[1] == ["hour 0: cannot sell with the battery at 0/1"]
    assert simulate(["charge", "charge"], [1, 2], 1)[1] == ["hour 1: cannot charge with the battery at 1/1"]
    assert "one per hour" in simulate(["idle"], [1, 2], 1)[1][0]
    assert "unknown action 'buy'" in simulate(["buy", "idle"], [1, 2], 1)[1][0]


def test_score_formula():
    assert score(0, [], 10) == 0.2
    assert score(10, [], 10) == 1.0
    assert score(5, [], 10) == pytest.approx(0.6)
    assert score(-2.5, [], 10) == 0.0 and score(-100, [], 10) == 0.0
    assert score(10, ["hour 0: ..."], 10) == 0.0


EXTRAS = {"prices": [5, 1, 8, 2, 9, 3], "capacity": 1, "start": 0}  # optimum: buy 1 sell 8, buy 2 sell 9 = 14


def _submit(plan) -> str:
    return f"<tool_call>{json.dumps({'name': 'submit_schedule', 'arguments': {'schedule': plan}})}</tool_call>"


def test_idle_scores_point_two_and_optimum_one():
    assert optimum(EXTRAS["prices"], 1)[0] == 14
    env = make_env("gridsim", EXTRAS)
    idle = env.step(_submit(["idle"] * 6))
    assert idle.reward == pytest.approx(0.2) and not idle.done
    assert "Profit 0" in idle.observations[0]["content"]
    best = env.step(_submit("i c s c s i"))
    assert best.reward == pytest.approx(0.8) and best.done and env.metrics["best_score"] == 1.0


def test_rewards_sum_to_the_best_score_and_invalid_scores_zero():
    env = make_env("gridsim", EXTRAS, {"max_turns": 4})
    rewards = []
    half = ["idle", "charge", "sell", "idle", "idle", "idle"]  # profit 7 -> 0.6
    for reply in (_submit(half), _submit(["sell"] + ["idle"] * 5), _submit(["idle"] * 6), "I am done."):
        result = env.step(reply)
        rewards.append(result.reward)
    assert rewards == pytest.approx([0.6, 0.0, 0.0, 0.0])
    assert result.done and env.metrics["invalid"] == 1.0 and env.metrics["submissions"] == 3.0


def test_bad_calls_come_back_and_max_turns_ends():
    env = make_env("gridsim", EXTRAS, {"max_turns": 2})
    first = env.step('<tool_call>{"name": "submit_schedule", "arguments": {"schedule": 5}}</tool_call>')
    assert not first.done and "needs 'schedule'" in first.observations[0]["content"]
    last = env.step("<tool_call>{bad json</tool_call>")
    assert last.done and last.reward == 0.0 and env.metrics["parse_errors"] == 1.0


def test_unprofitable_day_is_a_task_bug():
    with pytest.raises(TaskBug):
        make_env("gridsim", {"prices": [5, 4, 3], "capacity": 1})


def test_generated_days_are_profitable_and_reference_replies_score_one():
    rows = generate_rows(5, seed=2)
    assert rows == generate_rows(5, seed=2)
    for row in rows:
        assert len(row["env_extras"]["prices"]) == 24
        env = make_env("gridsim", row["env_extras"])
        assert env.step(env.reference_reply(row["env_extras"])).reward == 1.0


def test_a_reply_without_a_call_asks_for_a_first_schedule_then_later_finishes():
    env = make_env("gridsim", EXTRAS, {"max_turns": 3})
    first = env.step("Let me think about the prices.")
    assert not first.done and "submit_schedule" in first.observations[0]["content"]
    env.step(_submit(["idle"] * 6))
    assert env.step("That is my schedule.").done
