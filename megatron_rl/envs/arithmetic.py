"""``arithmetic``: verifiable integer arithmetic; the tiny default task, with SFT demonstrations.

Easiest setting (what a ~10M-parameter model learns on CPU in minutes): ``digits=1, ops="+"``, reply
"The answer is 7." Knobs: operand digits, operators, number of terms, an optional format instruction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from megatron_rl.envs.registry import register_env
from megatron_rl.envs.single_answer import AnswerConfig, AnswerEnv

OPS = "+-*"
INSTRUCTION = "\nEnd your reply with: The answer is N."


def make_problem(rng: random.Random, digits: int, ops: str, terms: int) -> tuple[str, int]:
    """An expression over ``terms`` operands of up to ``digits`` digits and its value (usual precedence)."""
    numbers = [rng.randint(0, 10**digits - 1) for _ in range(terms)]
    chosen = [rng.choice(ops) for _ in range(terms - 1)]
    if chosen == ["-"] and numbers[0] < numbers[1]:  # two-term subtraction stays non-negative
        numbers.sort(reverse=True)
    expr = str(numbers[0]) + "".join(f" {op} {n}" for op, n in zip(chosen, numbers[1:]))
    return expr, eval(expr)  # our own digits and operators only


def generate_rows(n: int, seed: int, split: str = "train", digits: int = 1, ops: str = "+", terms: int = 2,
                  instruct: bool = False) -> list[dict]:
    """``n`` dataset rows ("What is 3 + 4?"); ``instruct`` appends the reply-format instruction."""
    if digits < 1 or terms < 2:
        raise ValueError(f"arithmetic: digits must be >= 1 and terms >= 2, got digits={digits}, terms={terms}")
    if not ops or set(ops) - set(OPS):
        raise ValueError(f"arithmetic: ops '{ops}' must be a non-empty subset of '{OPS}'")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        expr, value = make_problem(rng, digits, ops, terms)
        content = f"What is {expr}?" + (INSTRUCTION if instruct else "")
        rows.append({"prompt": [{"role": "user", "content": content}], "env_class": "arithmetic",
                     "env_extras": {"answer": str(value)}, "split": split, "instance_id": f"arithmetic-{seed}-{i}"})
    return rows


@dataclass
class ArithmeticConfig(AnswerConfig):
    """``envs.arithmetic.*``: reward shaping; the same fields as every final-answer env."""

    prefix = "envs.arithmetic"


@register_env
class ArithmeticEnv(AnswerEnv):
    """Reward 1 when "The answer is N." (or ``#### N`` / ``\\boxed{N}``) matches; shaping in the config."""

    name = "arithmetic"
    Config = ArithmeticConfig

    @classmethod
    def generate_rows(cls, n: int, seed: int, split: str = "train", **knobs) -> list[dict]:
        return generate_rows(n, seed, split, **knobs)

    @classmethod
    def reference_reply(cls, extras: dict) -> str:
        return f"The answer is {extras['answer']}."
