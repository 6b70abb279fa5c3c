"""``gridsim`` dataset rows: one day of prices and a battery per row."""

from __future__ import annotations

import random

from megatron_rl.envs.gridsim.battery import optimum
from megatron_rl.envs.gridsim.prices import make_prices

INSTRUCTION = ("You operate a grid battery for one day. Each hour choose charge (+1 unit, you pay the price), "
               "sell (-1 unit, you earn the price) or idle. The battery cannot go below 0 or above its capacity. "
               "Maximise profit and submit the schedule with submit_schedule. You get feedback and may revise.")


def generate_rows(n: int, seed: int, split: str = "train", hours: int = 24, capacity: int = 4) -> list[dict]:
    """``n`` rows whose day has a profitable schedule; ``env_extras``: prices, capacity, start."""
    if hours < 2 or capacity < 1:
        raise ValueError(f"gridsim: hours must be >= 2 and capacity >= 1, got hours={hours}, capacity={capacity}")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prices = make_prices(rng, hours)
        while optimum(prices, capacity)[0] <= 0:
            prices = make_prices(rng, hours)
        table = ", ".join(f"{h}: {p}" for h, p in enumerate(prices))
        user = f"Battery capacity: {capacity} units, starting empty.\nPrices by hour: {table}"
        rows.append({"prompt": [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": user}],
                     "env_class": "gridsim", "env_extras": {"prices": prices, "capacity": capacity, "start": 0},
                     "split": split, "instance_id": f"gridsim-{seed}-{i}"})
    return rows
