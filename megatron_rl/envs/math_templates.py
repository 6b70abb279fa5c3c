"""GSM8K-style word problems generated from templates: question, worked solution and ``#### answer``."""

from __future__ import annotations

import random

NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Iris", "Jamal", "Kira", "Liam"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "cards"]


def _shopping(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start, bags, per = rng.randint(2, 20), rng.randint(2, 6), rng.randint(2, 12)
    total = start + bags * per
    return (f"{name} has {start} {item}. {name} buys {bags} bags with {per} {item} in each bag. "
            f"How many {item} does {name} have now?",
            [f"The bags hold {bags} * {per} = {bags * per} {item}.", f"{start} + {bags * per} = {total}."], total)


def _sharing(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each, left = rng.randint(2, 8), rng.randint(2, 9), rng.randint(0, 15)
    start = friends * each + left
    return (f"{name} had {start} {item} and gave {each} to each of {friends} friends. How many {item} are left?",
            [f"{name} gave away {friends} * {each} = {friends * each}.", f"{start} - {friends * each} = {left}."], left)


def _wages(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    rate, hours, days = rng.randint(8, 30), rng.randint(2, 8), rng.randint(2, 6)
    total = rate * hours * days
    return (f"{name} earns ${rate} an hour and works {hours} hours a day for {days} days. "
            f"How many dollars does {name} earn?",
            [f"Each day: {rate} * {hours} = {rate * hours} dollars.", f"{rate * hours} * {days} = {total}."], total)


def _change(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    count, price = rng.randint(2, 9), rng.randint(2, 15)
    paid = ((count * price) // 10 + 1 + rng.randint(0, 5)) * 10
    change = paid - count * price
    return (f"{name} buys {count} {item} at ${price} each and pays with ${paid}. How much change, in dollars, "
            f"does {name} get?",
            [f"The {item} cost {count} * {price} = {count * price} dollars.", f"{paid} - {count * price} = {change}."],
            change)


def _speed(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    speed, hours, extra = rng.randint(20, 70), rng.randint(2, 6), rng.randint(5, 40)
    total = speed * hours + extra
    return (f"{name} drives at {speed} miles per hour for {hours} hours, then walks {extra} more miles. "
            f"How many miles does {name} travel in total?",
            [f"Driving: {speed} * {hours} = {speed * hours} miles.", f"{speed * hours} + {extra} = {total}."], total)


def _ages(rng: random.Random) -> tuple[str, list[str], int]:
    a, b = rng.sample(NAMES, 2)
    age, diff, years = rng.randint(5, 40), rng.randint(2, 20), rng.randint(2, 15)
    total = age + diff + years
    return (f"{a} is {age} years old. {b} is {diff} years older than {a}. How old will {b} be in {years} years?",
            [f"{b} is {age} + {diff} = {age + diff} now.", f"In {years} years: {age + diff} + {years} = {total}."],
            total)


def _rows(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    rows, per, removed = rng.randint(3, 12), rng.randint(3, 12), rng.randint(1, 9)
    total = rows * per - removed
    return (f"{name} arranges {item} in {rows} rows of {per}, then removes {removed}. How many {item} remain?",
            [f"There were {rows} * {per} = {rows * per}.", f"{rows * per} - {removed} = {total}."], total)


TEMPLATES = [_shopping, _sharing, _wages, _change, _speed, _ages, _rows]


def make_problem(rng: random.Random) -> tuple[str, str, int]:
    """A question, its worked solution ending in ``#### N``, and N."""
    question, steps, answer = rng.choice(TEMPLATES)(rng)
    return question, " ".join(steps) + f"\n#### {answer}", answer
