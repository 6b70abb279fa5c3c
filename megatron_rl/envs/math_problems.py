"""``math``: GSM8K-style word problems scored by their final answer (``#### 42``, ``\\boxed{42}``, "The answer is 42").

Rows come from a user's parquet/JSONL file (``rows_from_file``, GSM8K's ``question``/``answer`` columns by
default) or from templates (``generate_rows``), so nothing needs downloading.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from megatron_rl.envs.answers import extract_answer
from megatron_rl.envs.math_templates import make_problem
from megatron_rl.envs.registry import register_env
from megatron_rl.envs.single_answer import AnswerConfig, AnswerEnv

INSTRUCTION = "Solve the problem step by step. Put the final answer on its own line as: #### <number>"


def _row(question: str, answer: str, split: str, instance_id: str, solution: str | None = None) -> dict:
    extras = {"answer": answer} if solution is None else {"answer": answer, "solution": solution}
    return {"prompt": [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}],
            "env_class": "math", "env_extras": extras, "split": split, "instance_id": instance_id}


def generate_rows(n: int, seed: int, split: str = "train") -> list[dict]:
    """``n`` template word problems with worked solutions (kept in ``env_extras["solution"]``)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question, solution, answer = make_problem(rng)
        rows.append(_row(question, str(answer), split, f"math-{seed}-{i}", solution))
    return rows


def rows_from_records(records: list[dict], source: str, split: str = "train", question_key: str = "question",
                      answer_key: str = "answer") -> list[dict]:
    """Rows from GSM8K-like records; the gold answer is read from ``#### N`` (or boxed / "answer is") in ``answer_key``."""
    rows = []
    for i, rec in enumerate(records):
        for key in (question_key, answer_key):
            if key not in rec:
                raise ValueError(f"{source} row {i}: no column '{key}' (columns: {sorted(rec)})")
        gold = extract_answer(str(rec[answer_key])) or str(rec[answer_key]).strip()
        rows.append(_row(str(rec[question_key]), gold, split, f"{Path(source).stem}-{i}", str(rec[answer_key])))
    return rows


def rows_from_file(path: str | Path, split: str = "train", question_key: str = "question",
                   answer_key: str = "answer") -> list[dict]:
    """Rows from a user's GSM8K-style parquet or JSONL file."""
    from megatron_rl.data.io import read_records

    return rows_from_records(read_records(path), str(path), split, question_key, answer_key)


@dataclass
class MathConfig(AnswerConfig):
    """``envs.math.*``: reward shaping; the same fields as every final-answer env."""

    prefix = "envs.math"


@register_env
class MathEnv(AnswerEnv):
    """Reward 1 when the reply's final answer equals ``extras["answer"]`` numerically."""

    name = "math"
    Config = MathConfig

    @classmethod
    def generate_rows(cls, n: int, seed: int, split: str = "train", **knobs) -> list[dict]:
        return generate_rows(n, seed, split, **knobs)

    @classmethod
    def reference_reply(cls, extras: dict) -> str:
        return extras.get("solution") or f"#### {extras['answer']}"
