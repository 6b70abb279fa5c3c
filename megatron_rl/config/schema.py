"""The top-level config: one section per room, each defined next to the component it configures."""

from dataclasses import dataclass, field

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.config.model import ModelConfig
from megatron_rl.config.run import RunConfig
from megatron_rl.data.config import DataConfig
from megatron_rl.generator.config import GeneratorConfig
from megatron_rl.inference.config import InferenceConfig
from megatron_rl.runtime.config import PlacementConfig
from megatron_rl.schedules.config import ScheduleConfig, SFTConfig
from parallel.config import CriticConfig, TrainerConfig
from weight_transfer.config import WeightTransferConfig


@dataclass
class TrainConfig:
    """Everything a run reads. Recipes (``recipes/*.yaml``) override it; users override recipes."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    envs: dict = field(default_factory=dict)
    """Per-environment settings, ``envs.<env_class>.<field>`` (each env's own Config dataclass)."""
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model; used when ``algorithm.advantage_estimator=gae``."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    weight_transfer: WeightTransferConfig = field(default_factory=WeightTransferConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Which nodes the trainer ranks and the managed servers run on (Ray node labels)."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self) -> None:
        algo = self.algorithm
        if algo.filters.dynamic_sampling_type == "replace" and self.schedule.type != "sync":
            raise ValueError(
                "algorithm.filters.dynamic_sampling_type=replace: only schedule.type=sync samples extra groups "
                f"for a step; with schedule.type={self.schedule.type} set algorithm.filters.zero_variance_filter=true "
                "instead (fully_async then keeps generating until data.train_batch_size groups vary)"
            )
        if algo.routing_replay.mode.value == "r2" and _optimizer_steps_per_batch(algo, self.data.train_batch_size) < 2:
            raise ValueError(
                "algorithm.routing_replay.mode=r2: R2 replays the routing of the old-log-prob pass to the "
                f"optimizer steps of one batch, and algorithm.ppo_mini_batch_size={algo.ppo_mini_batch_size} with "
                f"ppo_epochs={algo.ppo_epochs} takes one step per batch of data.train_batch_size="
                f"{self.data.train_batch_size} groups, so R2 would equal free routing. Set ppo_mini_batch_size "
                "below train_batch_size or ppo_epochs > 1, or use r3 (replay the sampler's experts)."
            )


def _optimizer_steps_per_batch(algo: AlgorithmConfig, groups: int) -> int:
    mini = algo.ppo_mini_batch_size or groups
    return -(-groups // mini) * algo.ppo_epochs
