"""text2sql: scoring against gold result sets, errors as observations, read-only and time limits."""

import json
import sqlite3

import pytest

from megatron_rl.envs import TaskBug, make_env
from megatron_rl.envs.text2sql import generate_rows
from megatron_rl.envs.text2sql.compare import results_match
from megatron_rl.envs.text2sql.executor import run_query

DB = {"domain": "test", "tables": [
    {"name": "pets", "columns": [["id", "INTEGER PRIMARY KEY"], ["name", "TEXT"], ["age", "INTEGER"]],
     "rows": [[1, "Rex", 3], [2, "Tom", 5], [3, "Kit", 5]]},
]}
PROMPT = [{"role": "user", "content": "Names of pets aged 5?"}]


def _call(query: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'run_sql', 'arguments': {'query': query}})}</tool_call>"


@pytest.fixture
def env():
    env = make_env("text2sql", {"db": DB, "gold_sql": "SELECT name FROM pets WHERE age = 5"}, {"max_turns": 3})
    env.init(PROMPT)
    yield env
    env.close()


def test_correct_query_in_any_order_scores_one(env):
    result = env.step(_call("SELECT name FROM pets WHERE age > 4 ORDER BY name DESC"))
    assert (result.reward, result.done) == (1.0, True)


def test_sql_block_is_read_and_wrong_result_scores_zero(env):
    result = env.step("Here:\n```sql\nSELECT name FROM pets\n```")
    assert (result.reward, result.done, env.metrics["correct"]) == (0.0, True, 0.0)


def test_runs_reward_tells_a_wrong_answer_from_a_malformed_reply():
    knobs = {"max_turns": 1, "runs_reward": 0.1}
    rewards = []
    for reply in (_call("SELECT name FROM pets WHERE age = 5"), _call("SELECT name FROM pets"),
                  _call("SELECT nme FROM pets"), '<tool_call>{"name": "run_sql"</tool_call>'):
        env = make_env("text2sql", {"db": DB, "gold_sql": "SELECT name FROM pets WHERE age = 5"}, knobs)
        env.init(PROMPT)
        rewards.append(env.step(reply).reward)
        env.close()
    assert rewards == [1.0, 0.1, 0.0, 0.0]  # right, runs but wrong, errors, does not parse


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_runs_reward_must_stay_below_the_right_answers(value):
    with pytest.raises(ValueError, match=r"envs\.text2sql\.runs_reward"):
        make_env("text2sql", {"db": DB, "gold_sql": "SELECT 1"}, {"runs_reward": value})


def test_errors_come_back_as_observations_until_max_turns(env):
    first = env.step(_call("SELECT nme FROM pets"))
    assert not first.done and first.reward == 0.0
    assert first.observations[0]["role"] == "tool" and "no such column: nme" in first.observations[0]["content"]
    second = env.step("I am not sure.")
    assert not second.done and "No SQL query found" in second.observations[0]["content"]
    assert second.observations[0]["role"] == "user"
    third = env.step('<tool_call>{"name": "run_sql"</tool_call>')
    assert third.done and third.reward == 0.0
    assert env.metrics == {"sql_errors": 1.0, "parse_errors": 1.0, "turns": 3.0, "correct": 0.0}


def test_repair_after_an_error_scores(env):
    assert not env.step(_call("SELEC name FROM pets")).done
    assert env.step(_call("SELECT name FROM pets WHERE age = 5")).reward == 1.0


@pytest.mark.parametrize("statement", ["DELETE FROM pets", "DROP TABLE pets", "UPDATE pets SET age = 0",
                                       "INSERT INTO pets VALUES (9, 'X', 1)", "ATTACH DATABASE ':memory:' AS x",
                                       "PRAGMA query_only = OFF"])
def test_writes_fail_without_changing_the_db(env, statement):
    result = env.step(_call(statement))
    assert not result.done and "Error" in result.observations[0]["content"]
    rows = sqlite3.connect(env.db_path).execute("SELECT * FROM pets ORDER BY id").fetchall()
    assert rows == [(1, "Rex", 3), (2, "Tom", 5), (3, "Kit", 5)]


def test_multiple_statements_are_refused(env):
    result = env.step(_call("SELECT 1; DELETE FROM pets"))
    assert not result.done
    assert sqlite3.connect(env.db_path).execute("SELECT COUNT(*) FROM pets").fetchone() == (3,)


def test_slow_query_hits_the_time_limit(tmp_path):
    path = tmp_path / "x.sqlite"
    sqlite3.connect(path).close()
    slow = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000000) "
            "SELECT COUNT(*) FROM c")
    result = run_query(path, slow, time_limit_s=0.2, max_rows=10)
    assert result.error is not None and "time limit of 0.2s" in result.error


def test_row_limit_truncates_and_fails_the_answer(tmp_path):
    path = tmp_path / "x.sqlite"
    sqlite3.connect(path).close()
    result = run_query(path, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50) "
                       "SELECT x FROM c", time_limit_s=5, max_rows=10)
    assert result.truncated and len(result.rows) == 10


def test_ordered_gold_requires_order():
    assert results_match([(1,), (2,)], [(2,), (1,)], ordered=False)
    assert not results_match([(1,), (2,)], [(2,), (1,)], ordered=True)
    assert not results_match([(1,), (1,)], [(1,)], ordered=False)  # multisets, not sets
    assert results_match([(0.1 + 0.2,)], [(0.3,)], ordered=True)
    env = make_env("text2sql", {"db": DB, "gold_sql": "SELECT name FROM pets ORDER BY age, name"})
    env.init(PROMPT)
    assert env.step(_call("SELECT name FROM pets ORDER BY name")).reward == 0.0
    env.close()


def test_broken_gold_is_a_task_bug_and_close_removes_the_db():
    env = make_env("text2sql", {"db": DB, "gold_sql": "SELECT missing FROM pets"})
    with pytest.raises(TaskBug):
        env.init(PROMPT)
    env.close()
    with pytest.raises(ValueError, match="gold_sql"):
        make_env("text2sql", {"db": DB})


def test_generated_rows_score_their_reference_and_clean_up():
    for row in generate_rows(12, seed=5):
        env = make_env("text2sql", row["env_extras"])
        env.init(row["prompt"])
        path = env.db_path
        assert env.step(env.reference_reply(row["env_extras"])).reward == 1.0
        env.close()
        assert not path.exists()


def test_qwen3_coder_calls_are_accepted(env):
    env.config.tool_call_format = "qwen3_coder"
    call = "<tool_call><function=run_sql><parameter=query>\nSELECT name FROM pets WHERE age = 5\n</parameter></function></tool_call>"
    assert env.step(call).reward == 1.0
