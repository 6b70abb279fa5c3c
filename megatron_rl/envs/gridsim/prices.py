"""Hourly price days with a night trough and morning/evening peaks, plus noise: integers."""

from __future__ import annotations

import math
import random


def make_prices(rng: random.Random, hours: int = 24) -> list[int]:
    """``hours`` integer prices (currency per unit) for one day."""
    base, swing = rng.randint(20, 60), rng.randint(10, 40)
    prices = []
    for h in range(hours):
        t = 24 * h / hours
        shape = 0.6 * math.exp(-((t - 8) ** 2) / 6) + math.exp(-((t - 19) ** 2) / 5) - 0.5 * math.exp(-((t - 3) ** 2) / 8)
        prices.append(max(1, round(base + swing * shape + rng.gauss(0, swing / 5))))
    return prices
