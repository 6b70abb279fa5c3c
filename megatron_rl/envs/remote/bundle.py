"""An env bundle: a module, a ``.py`` file or a folder (with ``__init__.py``) that registers envs on import and
may list tasks: ``TASKS`` (rows in the project's format) or ``tasks(split) -> rows``. ``builtin`` serves the
built-in envs and no tasks."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_bundle(spec: str) -> ModuleType | None:
    """Import the bundle named by ``spec`` (registering its envs); None for ``builtin``."""
    import megatron_rl.envs  # noqa: F401  (the built-ins)

    if spec == "builtin":
        return None
    path = Path(spec)
    if path.is_dir():
        path = path / "__init__.py"
    if path.suffix == ".py":
        if not path.is_file():
            raise ValueError(f"env bundle '{spec}': no such file")
        name = f"megatron_rl_bundle_{path.parent.name}_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as err:
        raise ValueError(f"env bundle '{spec}': not a folder, .py file or importable module ({err})") from None


def bundle_tasks(bundle: ModuleType | None, split: str | None) -> list[dict]:
    """The bundle's task rows of ``split`` (all if None)."""
    if bundle is None:
        return []
    if callable(getattr(bundle, "tasks", None)):
        rows = bundle.tasks(split)
    else:
        rows = list(getattr(bundle, "TASKS", []))
    return [r for r in rows if split is None or r.get("split") == split]
