"""Every environment variable megatron-rl reads, in one place."""

import os
from pathlib import Path

RUN_SECRET = "MEGATRON_RL_RUN_SECRET"
ENGINE_DIES_WITH_SERVER = "MEGATRON_RL_ENGINE_DIES_WITH_SERVER"  # set by managed servers: ``vllm_plugin``


def cache_dir() -> Path:
    """Where generated artefacts (tiny models, tokenizers) are cached: ``MEGATRON_RL_CACHE``."""
    default = Path.home() / ".cache" / "megatron_rl"
    return Path(os.environ.get("MEGATRON_RL_CACHE", default))


def wandb_mode() -> str:
    """W&B mode; offline unless the user says otherwise (``WANDB_MODE``)."""
    return os.environ.get("WANDB_MODE", "offline")


def run_secret() -> str | None:
    """The run's secret guarding the managed servers' routes (``MEGATRON_RL_RUN_SECRET``); unset: the fleet
    makes one per run. Set it to reach an external fleet started with the same secret."""
    return os.environ.get(RUN_SECRET) or None


def secret(name: str) -> str | None:
    """The value of the environment variable ``name`` that holds a token (rows and flags carry only the name)."""
    return os.environ.get(name) or None
