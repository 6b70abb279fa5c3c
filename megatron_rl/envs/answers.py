"""Final-answer extraction and comparison for verifiable math: ``#### 42``, ``\\boxed{42}``, "The answer is 42"."""

from __future__ import annotations

import re
from fractions import Fraction

_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"answer is[:\s]*\$?\s*([-+]?[\d,]*\.?\d+(?:/\d+)?)", re.IGNORECASE)
_BOXED = "\\boxed{"

FORMATS = ("hashes", "boxed", "answer_is")
"""Extraction formats in priority order; within one format the last occurrence wins."""


def _last_boxed(text: str) -> str | None:
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced: no answer


def _last(pattern: re.Pattern, text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1] if found else None


def extract_answer(text: str, formats: tuple[str, ...] = FORMATS) -> str | None:
    """The final answer's text in the first format (of ``formats``) that occurs, else None."""
    finders = {"hashes": lambda t: _last(_HASHES, t), "boxed": _last_boxed, "answer_is": lambda t: _last(_ANSWER_IS, t)}
    for fmt in formats:
        if fmt not in finders:
            raise ValueError(f"answer format '{fmt}' unknown; known: {', '.join(FORMATS)}")
        found = finders[fmt](text)
        if found is not None and found.strip():
            return found.strip()
    return None


def to_number(answer: str) -> Fraction | None:
    """``answer`` as an exact number ("1,234", "$5", "-2.50", "3/4", "\\frac{3}{4}"), else None."""
    s = answer.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    frac = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", s)
    if frac:
        s = f"{frac.group(1)}/{frac.group(2)}"
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str, gold: str) -> bool:
    """Numerically equal when both parse as numbers, else equal after trimming and lower-casing."""
    p, g = to_number(predicted), to_number(gold)
    if p is not None and g is not None:
        return p == g
    return predicted.strip().rstrip(".").lower() == gold.strip().rstrip(".").lower()
