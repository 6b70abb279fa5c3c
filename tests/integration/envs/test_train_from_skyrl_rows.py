"""``megatron-rl train`` on a GSM8K-style parquet file in the SkyRL/veRL row format, written here as a user would."""

import random

from integration.test_train_job import QUICK, records, train
from megatron_rl.data import write_records


def gsm8k_rows(n: int, split: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                     "env_class": "gsm8k", "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
                     "extra_info": {"split": split, "index": i, "question": f"What is {a} + {b}?"},
                     "difficulty": "easy"})
    return rows


def test_trains_from_skyrl_rows_and_evaluates_on_their_test_split(tmp_path):
    path = write_records(gsm8k_rows(48, "train", 0) +
                         [{**r, "extra_info": {**r["extra_info"], "index": 100 + k}}
                          for k, r in enumerate(gsm8k_rows(6, "test", 1))], tmp_path / "gsm8k" / "train.parquet")
    train(tmp_path, "recipe=tiny_cpu", f"data.train_files=[{path}]", *QUICK, "schedule.eval_every=2",
          "data.train_batch_size=4", "run.name=skyrl")
    folder = tmp_path / "skyrl"
    metrics = records(folder, "metrics.jsonl")
    assert metrics[0]["data/train_prompts"] == 48 and metrics[0]["data/eval_prompts"] == 6
    assert [m["step"] for m in metrics if "reward/mean" in m] == [1, 2]
    assert [m["eval/num_prompts"] for m in metrics if "eval/num_prompts" in m][-1] == 6
    ledger = records(folder, "trajectories.jsonl")
    assert ledger and all(r["data_source"] == "openai/gsm8k" for r in ledger)
    trained = {r["trajectory_id"].rpartition("#")[0] for r in ledger}
    assert trained <= {f"train-{i}" for i in range(48)}  # never the test split's rows (train-100 ...)
    log = "".join(p.read_text() for p in tmp_path.glob("log-*.txt"))
    assert log.count("columns not used: difficulty") == 1 and "evaluation on split" in log
