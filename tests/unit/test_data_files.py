"""Prompt files: round trips for every env in both formats, and validation errors naming file, row and column."""

import json

import pytest

from megatron_rl.data import demonstrations, load_prompts, read_records, write_dataset, write_records
from megatron_rl.envs import make_env

ROW = {"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "env_class": "arithmetic",
       "env_extras": {"answer": "2"}, "split": "train"}


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
@pytest.mark.parametrize("env", ["arithmetic", "math", "text2sql", "gridsim"])
def test_generated_datasets_round_trip(tmp_path, env, suffix):
    path = write_dataset(env, 4, seed=7, path=tmp_path / f"d{suffix}", split="test")
    items = load_prompts(path, split="test")
    assert [i.instance_id for i in items] == [f"{env}-7-{k}" for k in range(4)]
    rows = read_records(path)
    assert items[0].env_extras == (json.loads(rows[0]["env_extras"]) if suffix == ".parquet" else rows[0]["env_extras"])
    assert path.stat().st_size < 20_000


def test_demonstrations_are_prompt_plus_a_reply_that_scores_one(tmp_path):
    items = load_prompts(write_dataset("arithmetic", 3, 0, tmp_path / "a.jsonl"))
    for item, conv in zip(items, demonstrations(items)):
        assert conv[:-1] == item.prompt and conv[-1]["role"] == "assistant"
        assert make_env("arithmetic", item.env_extras).step(conv[-1]["content"]).reward == 1.0


def test_split_filter_and_default_instance_ids(tmp_path):
    path = write_records([ROW, {**ROW, "split": "test"}], tmp_path / "mine.jsonl")
    assert [i.instance_id for i in load_prompts(path, "test")] == ["mine-1"]
    with pytest.raises(ValueError, match="no rows with split 'val'"):
        load_prompts(path, "val")


@pytest.mark.parametrize("change, message", [
    ({"split": None}, "row 1, column 'split': missing"),
    ({"env_class": "arith"}, "row 1, column 'env_class': 'arith' is not registered; known: arithmetic"),
    ({"prompt": []}, "row 1, column 'prompt': must be a non-empty list"),
    ({"prompt": [{"role": "user"}]}, "row 1, column 'prompt': message"),
    ({"env_extras": "{oops"}, "row 1, column 'env_extras': is a string that is not JSON"),
    ({"env_extras": [1]}, "row 1, column 'env_extras': must be a dict"),
    ({"instance_id": "a"}, "row 1, column 'instance_id': 'a' already used in"),
])
def test_validation_names_file_row_and_column(tmp_path, change, message):
    path = write_records([{**ROW, "instance_id": "a"}, {**ROW, **change}], tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="bad.jsonl " + message.replace("(", r"\(")):
        load_prompts(path)


def test_missing_column_in_parquet(tmp_path):
    path = write_records([{k: v for k, v in ROW.items() if k != "env_class"}], tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"p.parquet row 0, column 'env_class': missing"):
        load_prompts(path)


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        load_prompts(tmp_path / "x.csv")
    with pytest.raises(ValueError, match="no such file"):
        load_prompts(tmp_path / "x.jsonl")
    (tmp_path / "broken.jsonl").write_text('{"prompt": 1}\n{nope\n')
    with pytest.raises(ValueError, match="broken.jsonl line 2: not valid JSON"):
        load_prompts(tmp_path / "broken.jsonl")
