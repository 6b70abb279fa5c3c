"""The config explained to a person: recipes with their purpose, and every key with its docstring and default.

Field docstrings (the string literal under each dataclass field) are read from the source, so the help
the CLI prints is the documentation the code already carries.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from functools import cache

from megatron_rl.config.load import RECIPES_DIR, recipe_names
from megatron_rl.config.schema import TrainConfig

MOST_USED = (
    "model.path", "data.train_files", "data.eval_files", "run.name", "run.output_dir", "run.resume",
    "schedule.type", "schedule.total_steps", "data.train_batch_size", "generator.n_samples_per_prompt",
    "generator.max_tokens_per_turn", "inference.num_servers", "trainer.optimizer.lr",
)
"""Keys ``train --help`` lists: what a newcomer changes first."""


def recipe_purpose(name: str, width: int = 100) -> str:
    """The first sentence of the comment that opens ``recipes/<name>.yaml``."""
    lines = (RECIPES_DIR / f"{name}.yaml").read_text().splitlines()
    words = " ".join(line.lstrip("# ").strip() for line in _leading_comment(lines))
    return _first_sentence(words, width)


def _leading_comment(lines: list[str]) -> list[str]:
    block = []
    for line in lines:
        if not line.startswith("#"):
            break
        block.append(line)
    return block


@cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a dataclass, from the string literal under each field in its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def leaves(obj, cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, object, object, str]]:
    """``(dotted key, value in obj, schema default, docstring)`` for every leaf field under ``obj``."""
    out = []
    defaults = cls()
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += leaves(value, type(value), f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", value, getattr(defaults, f.name), docs.get(f.name, "")))
    return out


def describe(cfg: TrainConfig) -> str:
    """Every key: ``key = value`` (with the schema default when the recipe or command line changed it), then
    its docstring."""
    rows = []
    for key, value, default, doc in leaves(cfg):
        changed = "" if value == default else f"   (default {default!r})"
        rows.append(f"{key} = {value!r}{changed}\n    {doc}" if doc else f"{key} = {value!r}{changed}")
    return "\n".join(rows)


def train_epilog() -> str:
    """What ``train --help`` adds: the recipes with their purpose, the most used keys, where outputs go."""
    width = max(map(len, recipe_names()))
    recipes = "\n".join(f"  {name:<{width}}  {recipe_purpose(name)}" for name in recipe_names())
    docs = {key: doc for key, _, _, doc in leaves(TrainConfig())}
    keys = "\n".join(f"  {key:<32} {_first_sentence(docs[key], 80)}" for key in MOST_USED)
    return (f"recipes (recipe=NAME, or recipe=path/to/file.yaml):\n{recipes}\n\n"
            f"most used keys (all of them: megatron-rl config --describe):\n{keys}\n\n"
            "outputs go to <run.output_dir>/<run.name>/ (metrics.jsonl, checkpoints, server logs).\n"
            "your own data: data.train_files=[rows.jsonl] (README: \"Your own data\"); "
            "your own model: model.path=DIR (README: \"Your own model\").")


def _first_sentence(text: str, width: int) -> str:
    """Up to the first full stop, cut to ``width`` characters."""
    sentence = re.split(r"(?<=\.)\s", text, maxsplit=1)[0].rstrip(".")
    return sentence if len(sentence) <= width else sentence[: width - 1].rstrip() + "…"
