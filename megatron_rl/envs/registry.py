"""Environments by exact name: a dataset row's ``env_class`` picks one; users register their own."""

from __future__ import annotations

from megatron_rl.envs.base import Env

_ENVS: dict[str, type[Env]] = {}


def register_env(cls: type[Env], *, replace: bool = False) -> type[Env]:
    """Register ``cls`` under ``cls.name``; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise TypeError(f"register_env: {cls!r} is not an Env subclass")
    if not cls.name:
        raise ValueError(f"register_env: {cls.__name__}.name is empty; set a class attribute name = '...'")
    if cls.name in _ENVS and _ENVS[cls.name] is not cls and not replace:
        raise ValueError(f"register_env: '{cls.name}' is already registered to {_ENVS[cls.name].__qualname__}; "
                         "pass replace=True to override it")
    _ENVS[cls.name] = cls
    return cls


def env_names() -> list[str]:
    return sorted(_ENVS)


def get_env_class(name: str) -> type[Env]:
    """The class registered as ``name``; ValueError listing the known names otherwise."""
    try:
        return _ENVS[name]
    except KeyError:
        raise ValueError(f"env_class '{name}' is not registered; known: {', '.join(env_names())}. "
                         "Register your own with megatron_rl.envs.register_env") from None


def make_env(name: str, extras: dict, config: object | dict | None = None) -> Env:
    """A fresh environment for one episode of the row whose env_class is ``name``.

    ``config``: the env's ``Config`` dataclass or a dict of its fields (``envs.<name>.*``); defaults if None.
    """
    return get_env_class(name)(extras, config)


def env_tools(name: str) -> list[dict]:
    """The tool schemas ``name`` offers (empty when it offers none)."""
    return list(get_env_class(name).tools)
