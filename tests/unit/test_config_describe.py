"""The CLI explains itself: recipes with their purpose, every key with its docstring and default."""

from dataclasses import dataclass

import pytest

from megatron_rl.cli import main
from megatron_rl.config import TrainConfig, load_config
from megatron_rl.config.describe import MOST_USED, describe, field_docs, leaves, recipe_purpose
from megatron_rl.config.load import recipe_names


@dataclass
class _Example:
    plain: int = 1
    """First line
    continued."""
    undocumented: str = "x"


def test_field_docs_read_the_string_under_each_field():
    assert field_docs(_Example) == {"plain": "First line continued."}


def test_every_config_key_has_a_docstring():
    missing = [key for key, _, _, doc in leaves(TrainConfig()) if not doc]
    assert not missing, missing


def test_describe_names_the_default_only_when_changed():
    text = describe(load_config(["run.seed=3"])).splitlines()
    assert "run.seed = 3   (default 0)" in text
    assert "run.name = 'tiny_cpu'" in text
    assert text[text.index("run.name = 'tiny_cpu'") + 1].strip().startswith("Run name;")


def test_recipe_purpose_is_the_first_sentence_of_its_comment():
    assert recipe_purpose("qwen3_8b") == "Qwen3-8B (dense, 8.2B): a plan-only recipe"
    assert recipe_purpose("tiny_cpu", width=20) == "The default: a tiny…"


def test_train_help_lists_recipes_and_most_used_keys(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in recipe_names())
    assert all(f"  {key} " in out for key in MOST_USED)
