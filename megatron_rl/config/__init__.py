"""Structured run config (dataclasses registered with Hydra), recipes and overrides."""

from megatron_rl.config.load import load_config, to_yaml
from megatron_rl.config.schema import TrainConfig

__all__ = ["TrainConfig", "load_config", "to_yaml"]
