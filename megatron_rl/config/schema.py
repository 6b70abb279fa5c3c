"""The top-level config: one section per room, each defined next to the component it configures."""

from dataclasses import dataclass, field

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.config.model import ModelConfig
from megatron_rl.config.run import RunConfig
from megatron_rl.generator.config import GeneratorConfig


@dataclass
class TrainConfig:
    """Everything a run reads. Recipes (``recipes/*.yaml``) override it; users override recipes."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
