"""Every environment variable megatron-rl reads, in one place."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where generated artefacts (tiny models, tokenizers) are cached: ``MEGATRON_RL_CACHE``."""
    default = Path.home() / ".cache" / "megatron_rl"
    return Path(os.environ.get("MEGATRON_RL_CACHE", default))


def wandb_mode() -> str:
    """W&B mode; offline unless the user says otherwise (``WANDB_MODE``)."""
    return os.environ.get("WANDB_MODE", "offline")
