"""SkyRL/veRL rows read as they are: env aliases, ground truth to the env's answer, load-time errors naming file,
row and field, ids unique across files, unused columns named once, evaluation never on another task's data."""

import logging

import pytest

from megatron_rl.data import load_prompts, write_records
from megatron_rl.data.loader import load_rows
from megatron_rl.data.splits import holdout_count, split_rows


def skyrl_row(i: int, env_class="gsm8k", truth="72", split="train") -> dict:
    """A row as SkyRL's gsm8k example writes it (``examples/gsm8k/gsm8k_dataset.py``)."""
    return {"data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"Natalia sold {i} clips. Let's think step by step."}],
            "env_class": env_class, "reward_spec": {"method": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": i, "answer": f"... #### {truth}", "question": "q"}}


def verl_row(i: int) -> dict:
    """A row as veRL's ``examples/data_preprocess/gsm8k.py`` writes it: ``ability`` and ``reward_model``."""
    return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "What is 6 * 7?"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": "42"},
            "extra_info": {"split": "train", "index": i}}


def test_skyrl_parquet_rows_load_as_math_items_with_their_ground_truth(tmp_path, caplog):
    path = write_records([skyrl_row(i) for i in range(3)], tmp_path / "train.parquet")
    with caplog.at_level(logging.INFO, logger="megatron_rl"):
        items = load_prompts(path)
    assert [i.instance_id for i in items] == ["train-0", "train-1", "train-2"]
    assert {i.env_class for i in items} == {"math"}
    assert items[1].env_extras == {"answer": "72"}
    assert items[1].data_source == "openai/gsm8k" and items[1].extra_info["index"] == 1
    assert items[1].prompt == [{"role": "user", "content": "Natalia sold 1 clips. Let's think step by step."}]
    # SkyRL's reward_spec.method is read as part of the spec, so no column is left unused here
    assert "columns not used" not in caplog.text
    assert caplog.text.count("extra_info kept on each item: answer, index, question, split") == 1


def test_verl_rows_map_through_ability_and_reward_model(tmp_path):
    items = load_prompts(write_records([verl_row(0), verl_row(5)], tmp_path / "v.jsonl"))
    assert [(i.instance_id, i.env_class, i.env_extras["answer"]) for i in items] == [("v-0", "math", "42"),
                                                                                     ("v-5", "math", "42")]


def test_unused_columns_are_named_once_per_file(tmp_path, caplog):
    rows = [{**skyrl_row(i), "difficulty": i, "source_url": "x"} for i in range(4)]
    with caplog.at_level(logging.INFO, logger="megatron_rl"):
        load_prompts(write_records(rows, tmp_path / "t.jsonl"))
    lines = [r.getMessage() for r in caplog.records if "columns not used" in r.getMessage()]
    assert lines == [f"data: {tmp_path / 't.jsonl'}: columns not used: difficulty, source_url"]


def test_same_file_names_in_two_folders_get_distinct_ids(tmp_path):
    a = write_records([skyrl_row(0), skyrl_row(1)], tmp_path / "gsm8k" / "train.parquet")
    b = write_records([skyrl_row(0, env_class="math")], tmp_path / "math" / "train.parquet")
    assert [i.instance_id for i in load_prompts([a, b])] == ["gsm8k/train-0", "gsm8k/train-1", "math/train-0"]


@pytest.mark.parametrize("row, message", [
    ({**skyrl_row(1), "reward_spec": {"method": "rule"}},
     r"row 1, field 'env_extras.answer': missing; env_class 'math' needs it \(from reward_spec.ground_truth"),
    ({**skyrl_row(1), "env_class": "sokoban"}, r"row 1, column 'env_class': 'sokoban' is neither a registered env"),
    ({**skyrl_row(1), "extra_info": {"split": 3}}, r"row 1, field 'extra_info.split': must be a string"),
    ({**skyrl_row(1), "extra_info": "{no"}, r"row 1, column 'extra_info': is a string that is not JSON"),
    ({**skyrl_row(1), "prompt": "just text"}, r"row 1, column 'prompt': must be a non-empty list"),
    ({**skyrl_row(0)}, r"row 1, column 'instance_id': 'f-0' already used in .*f.jsonl row 0"),
    ({"prompt": [{"role": "user", "content": "x"}], "env_class": "math", "env_extras": {}, "split": "train"},
     r"row 1, field 'env_extras.answer': missing; env_class 'math' needs it$"),
    ({"prompt": [{"role": "user", "content": "x"}], "env_class": "gridsim", "env_extras": {"prices": [1, 2]},
      "split": "train"}, r"row 1, field 'env_extras.capacity': missing; env_class 'gridsim' needs it$"),
])
def test_a_bad_row_is_refused_at_load_naming_file_row_and_field(tmp_path, row, message):
    path = write_records([skyrl_row(0), row], tmp_path / "f.jsonl")
    with pytest.raises(ValueError, match=r"f.jsonl " + message):
        load_prompts(path)


def test_unknown_env_names_list_registered_envs_and_aliases(tmp_path):
    path = write_records([skyrl_row(0, env_class="sokoban")], tmp_path / "f.jsonl")
    with pytest.raises(ValueError) as err:
        load_prompts(path)
    assert "registered: arithmetic, gridsim, math" in str(err.value) and "aliases: aime, DigitalLearningGmbH/MATH-lighteval, gsm8k," in str(err.value)


def test_eval_split_of_the_train_files_is_evaluated_and_never_trained(tmp_path):
    rows = [skyrl_row(i) for i in range(6)] + [skyrl_row(i, split="test") for i in range(6, 8)]
    s = split_rows(load_rows(write_records(rows, tmp_path / "d.parquet")), None, eval_holdout=64, seed=0)
    assert s.eval_source == "split"
    assert [i.instance_id for i in s.eval] == ["d-6", "d-7"] and len(s.train) == 6


def test_without_eval_split_rows_are_held_out_of_the_users_train_files(tmp_path):
    rows = load_rows(write_records([skyrl_row(i) for i in range(25)], tmp_path / "d.parquet"))
    s = split_rows(rows, None, eval_holdout=64, seed=3)
    # 64 asked, at most a tenth of 25 rows: 2 held out, all from the user's rows, disjoint from training
    assert s.eval_source == "holdout" and len(s.eval) == 2 and len(s.train) == 23
    assert {i.instance_id for i in s.eval}.isdisjoint(i.instance_id for i in s.train)
    assert split_rows(rows, None, 64, seed=3).eval == s.eval  # the same rows for the same seed
    assert split_rows(rows, None, eval_holdout=0, seed=3).eval_source == "none"


def test_eval_files_win_and_rows_marked_test_are_not_trained(tmp_path):
    train = load_rows(write_records([skyrl_row(0), skyrl_row(1, split="test")], tmp_path / "t.jsonl"))
    evals = load_rows(write_records([verl_row(9)], tmp_path / "e.jsonl"))
    s = split_rows(train, evals, eval_holdout=64, seed=0)
    assert [i.instance_id for i in s.train] == ["t-0"] and [i.instance_id for i in s.eval] == ["e-9"]
    with pytest.raises(ValueError, match="data.train_files: every row has an evaluation split"):
        split_rows(load_rows(write_records([skyrl_row(0, split="test")], tmp_path / "x.jsonl")), None, 64, 0)


@pytest.mark.parametrize("rows, asked, held", [(25, 64, 2), (1000, 64, 64), (5, 64, 1), (1, 64, 0), (100, 0, 0)])
def test_holdout_count(rows, asked, held):
    assert holdout_count(rows, asked) == held
