"""Final-answer extraction and the arithmetic / math envs: hand-checked replies."""

import pytest

from megatron_rl.envs import TaskBug, StepResult, make_env
from megatron_rl.envs.answers import answers_match, extract_answer
from megatron_rl.envs.arithmetic import generate_rows as arithmetic_rows
from megatron_rl.envs.math_problems import generate_rows as math_rows, rows_from_records


@pytest.mark.parametrize("text, expected", [
    ("So 3 + 4 = 7.\n#### 7", "7"),
    ("#### 1,234", "1,234"),
    ("first \\boxed{3} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("The answer is 42.", "42"),
    ("the answer is: $-3.5", "-3.5"),
    ("I think the answer is 5, no wait, the answer is 6.", "6"),
    ("\\boxed{9} and #### 8", "8"),  # hashes take priority over boxed
    ("\\boxed{12", None),  # unbalanced
    ("no final answer 17", None),
    ("The answer is", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("pred, gold, same", [
    ("1,234", "1234", True), ("$5", "5", True), ("5.0", "5", True), ("\\frac{1}{2}", "0.5", True),
    ("3/4", "0.75", True), ("7.", "7", True), ("8", "7", False), ("-2", "2", False), ("Yes", "yes", True),
])
def test_answers_match(pred, gold, same):
    assert answers_match(pred, gold) is same


def test_arithmetic_correct_wrong_and_unformatted():
    env = make_env("arithmetic", {"answer": "12"})
    assert env.step("The answer is 12.").reward == 1.0
    assert make_env("arithmetic", {"answer": "12"}).step("The answer is 13.").reward == 0.0
    result = make_env("arithmetic", {"answer": "12"}).step("12")
    assert (result.reward, result.done, result.metadata["formatted"]) == (0.0, True, 0.0)


def test_arithmetic_shaping_gives_partial_credit():
    config = {"format_reward": 0.1, "closeness_reward": 0.2}
    assert make_env("arithmetic", {"answer": "9"}, config).step("The answer is 8.").reward == pytest.approx(0.1 + 0.2 * 0.9)
    assert make_env("arithmetic", {"answer": "9"}, config).step("The answer is 100.").reward == pytest.approx(0.1)
    assert make_env("arithmetic", {"answer": "9"}, config).step("nine").reward == 0.0


def test_arithmetic_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"envs\.arithmetic\.format_reward"):
        make_env("arithmetic", {"answer": "1"}, {"format_reward": 1.5})
    with pytest.raises(ValueError, match=r"envs\.arithmetic\.bogus"):
        make_env("arithmetic", {"answer": "1"}, {"bogus": 1})
    with pytest.raises(ValueError, match="needs key 'answer'"):
        make_env("arithmetic", {})


def test_arithmetic_rows_are_deterministic_and_reference_replies_score_one():
    rows = arithmetic_rows(50, seed=3, digits=2, ops="+-*")
    assert rows == arithmetic_rows(50, seed=3, digits=2, ops="+-*")
    for row in rows:
        expr = row["prompt"][0]["content"].removeprefix("What is ").removesuffix("?")
        assert str(eval(expr)) == row["env_extras"]["answer"]
        env = make_env("arithmetic", row["env_extras"])
        assert env.step(env.reference_reply(row["env_extras"])).reward == 1.0


def test_arithmetic_easy_setting_is_single_digit_addition():
    rows = arithmetic_rows(200, seed=0)
    for row in rows:
        a, b = row["prompt"][0]["content"].removeprefix("What is ").removesuffix("?").split(" + ")
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9
    assert len({r["prompt"][0]["content"] for r in rows}) > 50
    with pytest.raises(ValueError, match="ops"):
        arithmetic_rows(1, 0, ops="/")


def test_math_template_solutions_score_one_and_gsm8k_records_convert():
    for row in math_rows(30, seed=1):
        env = make_env("math", row["env_extras"])
        assert env.step(env.reference_reply(row["env_extras"])).reward == 1.0
    rows = rows_from_records([{"question": "2 + 2?", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"}], "gsm8k.jsonl")
    assert rows[0]["env_extras"]["answer"] == "4" and rows[0]["instance_id"] == "gsm8k-0"
    assert make_env("math", rows[0]["env_extras"]).step("So \\boxed{4}").reward == 1.0
    with pytest.raises(ValueError, match="gsm8k.jsonl row 0: no column 'answer'"):
        rows_from_records([{"question": "?"}], "gsm8k.jsonl")


def test_step_result_detects_task_bugs():
    with pytest.raises(TaskBug):
        StepResult([], None, True)
    assert StepResult([{"role": "tool", "content": "x"}], None, False).reward is None
    observations, reward, done, metadata = StepResult([], 0.5, True, {"a": 1.0})
    assert (observations, reward, done, metadata) == ([], 0.5, True, {"a": 1.0})
