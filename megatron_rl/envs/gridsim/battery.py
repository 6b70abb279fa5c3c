"""A grid battery over hourly prices: schedule profit and validity, and the exact optimum by dynamic programming.

The battery holds 0..capacity units and starts with ``start`` units. Each hour it does one action:
``charge`` (+1 unit, pays that hour's price), ``sell`` (-1 unit, earns that hour's price) or ``idle``.
Charging when full or selling when empty is a violation.
"""

from __future__ import annotations

ACTIONS = ("charge", "sell", "idle")
_DELTA = {"charge": 1, "sell": -1, "idle": 0}


def simulate(schedule: list[str], prices: list[float], capacity: int, start: int = 0) -> tuple[float, list[str]]:
    """(profit, violations) of ``schedule``; violations name the hour and the problem."""
    if len(schedule) != len(prices):
        return 0.0, [f"schedule has {len(schedule)} actions; it needs one per hour ({len(prices)})"]
    level, profit, violations = start, 0.0, []
    for hour, (action, price) in enumerate(zip(schedule, prices)):
        if action not in _DELTA:
            violations.append(f"hour {hour}: unknown action '{action}' (use {', '.join(ACTIONS)})")
            continue
        new = level + _DELTA[action]
        if not 0 <= new <= capacity:
            violations.append(f"hour {hour}: cannot {action} with the battery at {level}/{capacity}")
            continue
        profit -= _DELTA[action] * price
        level = new
    return profit, violations


def optimum(prices: list[float], capacity: int, start: int = 0) -> tuple[float, list[str]]:
    """The best profit and a schedule reaching it: DP over (hour, battery level), O(hours * capacity)."""
    best = {start: (0.0, [])}
    for price in prices:
        nxt: dict[int, tuple[float, list[str]]] = {}
        for level, (profit, plan) in best.items():
            for action, delta in _DELTA.items():
                new = level + delta
                if 0 <= new <= capacity:
                    value = profit - delta * price
                    if new not in nxt or value > nxt[new][0]:
                        nxt[new] = (value, plan + [action])
        best = nxt
    return max(best.values(), key=lambda v: v[0])


def score(profit: float, violations: list[str], best: float) -> float:
    """0 if invalid, else ``clip(0.2 + 0.8 * profit / best, 0, 1)``: idle all day 0.2, the optimum 1."""
    if violations:
        return 0.0
    return min(1.0, max(0.0, 0.2 + 0.8 * profit / best))
