"""Deterministic text for training the tiny tokenizer: arithmetic, chat, tool calls, SQL, prose."""

import json
import random

_WORDS = (
    "the a an of to and in is it that for on with as at by from this be are was answer question "
    "number sum product difference total price hour battery charge sell idle profit table select "
    "where count group order join value result step think tool call user assistant system please "
    "compute what how many each more less than equal first then final because so we have is not "
    "buy store energy market day night morning evening row column name id city year score"
).split()

_SQL = (
    "SELECT", "FROM", "WHERE", "GROUP BY", "ORDER BY", "COUNT(*)", "SUM", "AVG", "JOIN", "ON",
    "LIMIT", "AND", "OR", "DESC", "ASC",
)


def _arith(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}? The answer is {value}."


def _prose(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30))).capitalize() + "."


def _tool_call(rng: random.Random) -> str:
    args = {"query": f"{rng.choice(_SQL)} {rng.choice(_WORDS)} {rng.choice(_SQL)} {rng.randint(0, 99)}"}
    body = json.dumps({"name": rng.choice(["run_sql", "set_schedule", "calculator"]), "arguments": args})
    return f"<tool_call>\n{body}\n</tool_call>"


def _chat(rng: random.Random) -> str:
    return (
        f"<|im_start|>system\n{_prose(rng)}<|im_end|>\n<|im_start|>user\n{_arith(rng)}<|im_end|>\n"
        f"<|im_start|>assistant\n<think>\n{_prose(rng)}\n</think>\n{_tool_call(rng)}<|im_end|>\n"
    )


def corpus(num_lines: int = 6000, seed: int = 0) -> list[str]:
    """A reproducible mix of the text kinds the toolkit's environments produce."""
    rng = random.Random(seed)
    makers = (_arith, _prose, _tool_call, _chat)
    return [rng.choice(makers)(rng) for _ in range(num_lines)]
