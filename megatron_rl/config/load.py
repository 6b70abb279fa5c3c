"""Compose a run's config: the dataclass schema, then a recipe, then ``key=value`` overrides.

Hydra's compose API does the merging; every unknown key, in a recipe or on the command line, fails
here with the key named and the nearest known keys suggested, before any expensive work starts.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from megatron_rl.config.schema import TrainConfig

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
DEFAULT_RECIPE = "tiny_cpu"
SCHEMA_NAME = "train_schema"


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def _recipe_location(recipe: str) -> tuple[Path, str]:
    path = Path(recipe)
    if path.suffix == ".yaml":
        if not path.is_file():
            raise ValueError(f"recipe={recipe}: no such file")
        return path.resolve().parent, path.stem
    if recipe not in recipe_names():
        raise ValueError(f"recipe={recipe}: unknown recipe; choose one of {recipe_names()} or give a .yaml path")
    return RECIPES_DIR, recipe


def _known_keys(node, prefix: str = "") -> list[str]:
    keys = []
    for k, v in node.items():
        name = f"{prefix}{k}"
        keys.extend(_known_keys(v, name + ".") if OmegaConf.is_dict(v) else [name])
    return keys


def _config_error(err: Exception, source: str) -> ValueError:
    """A readable ValueError for a bad key or value, naming the full key and where it came from."""
    text = str(err)
    key = getattr(err, "full_key", None) or _search(r"full_key: (\S+)", text) or _search(r"override '([^']+)'", text)
    if not re.search(r"Key '[^']+' (is )?not in", text):
        return ValueError(f"config key '{key}' ({source}): {text.splitlines()[0]}")
    schema = OmegaConf.structured(TrainConfig)
    free = next((prefix for prefix in _open_dicts(schema) if key.startswith(prefix)), None)
    if free is not None:  # `data.generate_knobs={hours:8}` where the recipe has none of those keys yet
        return ValueError(f"config key '{key}' ({source}): {free[:-1]} takes any key; add a new one with "
                          f"+{key}=VALUE (one per key)")
    close = difflib.get_close_matches(key, _known_keys(schema), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `megatron-rl config` prints every key"
    return ValueError(f"unknown config key '{key}' ({source}){hint}")


def split_recipe(args: list[str]) -> tuple[str, list[str]]:
    """Take ``recipe=NAME`` out of the override list."""
    recipes = [a.split("=", 1)[1] for a in args if a.startswith("recipe=")]
    if len(recipes) > 1:
        raise ValueError(f"recipe= given {len(recipes)} times; give it once")
    return (recipes[0] if recipes else DEFAULT_RECIPE), [a for a in args if not a.startswith("recipe=")]


def load_config(args: list[str]) -> TrainConfig:
    """``args`` are the command line's ``recipe=NAME`` and ``key=value`` words."""
    recipe, overrides = split_recipe(args)
    for word in overrides:
        if "=" not in word:
            raise ValueError(f"override {word!r}: expected key=value (e.g. run.seed=1)")
    config_dir, name = _recipe_location(recipe)
    ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name=name, overrides=overrides)
    except ConfigCompositionException as err:
        raise _config_error(err.__cause__ or err, "command line") from None
    except OmegaConfBaseException as err:
        raise _config_error(err, f"recipe {recipe}") from None
    _reject_added_keys(cfg, recipe)
    return _to_object(cfg)


def _open_dicts(node, prefix: str = "") -> list[str]:
    """Prefixes of plain-dict fields (``envs``, ``data.generate_knobs``): their keys are free."""
    found = []
    for k, v in node.items():
        if OmegaConf.is_dict(v):
            name = f"{prefix}{k}."
            found += [name] if OmegaConf.get_type(v) is dict else _open_dicts(v, name)
    return found


def _reject_added_keys(cfg, recipe: str) -> None:
    """``+key=value`` (or a recipe) can add keys Hydra lets through; the schema is the whole truth."""
    schema = OmegaConf.structured(TrainConfig)
    known, free = set(_known_keys(schema)), tuple(_open_dicts(schema))
    added = sorted(k for k in _known_keys(cfg) if k not in known and not k.startswith(free))
    if added:
        close = difflib.get_close_matches(added[0], sorted(known), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown config key '{added[0]}' (recipe {recipe} or command line){hint}")


def _search(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text)
    return match.group(1) if match else None


def _to_object(cfg) -> TrainConfig:
    try:
        return OmegaConf.to_object(cfg)
    except ValidationError as err:
        raise ValueError(f"config: {err.msg} (key {err.full_key})") from None


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
