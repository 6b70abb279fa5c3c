"""Trainer settings (``trainer.*``): parallel layout, precision, micro-batching, optimizer, schedule."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

_DTYPES = ("float32", "bfloat16")


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


@dataclass
class ParallelConfig:
    """How ranks split the model (``trainer.parallel``); data parallel takes the remaining ranks."""

    tensor_model_parallel_size: int = 1
    """Ranks that split each layer's matrices (attention heads, MLP columns, vocabulary)."""
    pipeline_model_parallel_size: int = 1
    """Ranks that split the layers into consecutive stages."""
    expert_model_parallel_size: int = 1
    """Ranks that split the experts of each MoE layer."""
    expert_tensor_parallel_size: int | None = None
    """Ranks that split each expert's matrices; None means the tensor-parallel size."""
    seed: int = 1234
    """Seed of the model-parallel RNG tracker."""

    def __post_init__(self) -> None:
        key = "trainer.parallel"
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size"):
            value = getattr(self, name)
            _require(value >= 1, f"{key}.{name}", f"must be >= 1, got {value}")
        if self.expert_tensor_parallel_size is not None:
            _require(self.expert_tensor_parallel_size >= 1, f"{key}.expert_tensor_parallel_size", "must be >= 1 or null")

    def check_model(self, num_experts: int) -> None:
        """Raise where megatron-core cannot train this layout on a model with ``num_experts`` routed experts."""
        tp = self.tensor_model_parallel_size
        _require(
            not num_experts or tp == 1,
            "trainer.parallel.tensor_model_parallel_size",
            f"{tp} on a MoE model ({num_experts} experts): megatron-core trains MoE layers under tensor parallelism "
            "only with sequence parallelism, which megatron-rl does not enable yet; set it to 1 and split the model "
            "with expert_model_parallel_size and pipeline_model_parallel_size",
        )

    def model_parallel_size(self) -> int:
        """Ranks holding one copy of the dense model."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def check_world(self, world_size: int) -> None:
        """Raise unless ``world_size`` ranks fit this layout."""
        mp = self.model_parallel_size()
        _require(
            world_size % mp == 0,
            "trainer.parallel",
            f"world size {world_size} is not a multiple of tensor x pipeline = {mp}; change the sizes or the ranks",
        )
        etp = self.expert_tensor_parallel_size or self.tensor_model_parallel_size
        expert_mp = etp * self.expert_model_parallel_size * self.pipeline_model_parallel_size
        _require(
            world_size % expert_mp == 0,
            "trainer.parallel.expert_model_parallel_size",
            f"world size {world_size} is not a multiple of expert tensor x expert x pipeline = {expert_mp}",
        )


@dataclass
class OptimizerConfig:
    """Adam with decoupled weight decay, megatron's distributed optimizer (``trainer.optimizer``)."""

    lr: float = 1e-6
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of the decay."""
    lr_warmup_steps: int = 0
    """Linear warm-up steps from 0 to ``lr``."""
    lr_decay_steps: int | None = None
    """Steps of decay after warm-up; None keeps ``lr`` constant."""
    lr_decay_style: str = "constant"
    """constant, linear or cosine."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.999
    """Adam beta2."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    clip_grad: float = 1.0
    """Global gradient-norm clip; 0 disables clipping."""
    use_distributed_optimizer: bool = True
    """Shard optimizer state over data-parallel ranks (ZeRO-1)."""

    def __post_init__(self) -> None:
        key = "trainer.optimizer"
        _require(self.lr > 0, f"{key}.lr", f"must be > 0, got {self.lr}")
        _require(0 <= self.min_lr <= self.lr, f"{key}.min_lr", f"must lie in [0, lr={self.lr}], got {self.min_lr}")
        _require(self.lr_warmup_steps >= 0, f"{key}.lr_warmup_steps", "must be >= 0")
        _require(
            self.lr_decay_style in ("constant", "linear", "cosine"),
            f"{key}.lr_decay_style",
            f"unknown {self.lr_decay_style!r}; known: constant, linear, cosine",
        )
        if self.lr_decay_style != "constant":
            _require(
                self.lr_decay_steps is not None and self.lr_decay_steps > 0,
                f"{key}.lr_decay_steps",
                f"must be > 0 with lr_decay_style={self.lr_decay_style}",
            )
        _require(self.clip_grad >= 0, f"{key}.clip_grad", f"must be >= 0, got {self.clip_grad}")
        _require(self.weight_decay >= 0, f"{key}.weight_decay", f"must be >= 0, got {self.weight_decay}")


RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe")
"""Selective recompute units megatron-core offers the non-TE specs (``moe_act`` needs TE's grouped MLP)."""


@dataclass
class RecomputeConfig:
    """Activation recompute (``trainer.recompute``): keep fewer activations, run their forward again
    in backward. megatron-core's own mechanism; routing replay stays exact under it."""

    granularity: str | None = None
    """null (keep every activation), full (whole layers) or selective (the ``modules`` below)."""
    method: str = "uniform"
    """full only: uniform (checkpoint chunks of ``num_layers`` layers) or block (checkpoint the first
    ``num_layers`` layers of each pipeline stage, keep the rest)."""
    num_layers: int = 1
    """full only: layers per chunk (uniform) or checkpointed layers per stage (block)."""
    modules: list[str] = field(default_factory=lambda: ["core_attn"])
    """selective only: any of core_attn, layernorm (Transformer Engine only), mlp (dense MLPs), moe
    (whole MoE layers)."""

    def __post_init__(self) -> None:
        key = "trainer.recompute"
        _require(
            self.granularity in (None, "full", "selective"),
            f"{key}.granularity",
            f"unknown {self.granularity!r}; known: null, full, selective",
        )
        _require(self.method in ("uniform", "block"), f"{key}.method", f"unknown {self.method!r}; known: uniform, block")
        _require(self.num_layers >= 1, f"{key}.num_layers", f"must be >= 1, got {self.num_layers}")
        unknown = sorted(set(self.modules) - set(RECOMPUTE_MODULES))
        _require(
            not unknown,
            f"{key}.modules",
            f"{unknown} not recomputable without Transformer Engine; choose from {list(RECOMPUTE_MODULES)} "
            "(moe_act: use moe, which recomputes the whole MoE layer)",
        )
        if self.granularity == "selective":
            _require(bool(self.modules), f"{key}.modules", "empty with granularity=selective; name at least one module")

    def transformer_config_kwargs(self) -> dict:
        """The TransformerConfig fields (megatron's names)."""
        if self.granularity is None:
            return {}
        if self.granularity == "full":
            return dict(recompute_granularity="full", recompute_method=self.method, recompute_num_layers=self.num_layers)
        return dict(recompute_granularity="selective", recompute_modules=list(self.modules))


@dataclass
class CriticConfig:
    """The value model (``critic``): built when ``algorithm.advantage_estimator=gae``, from the policy's
    HF checkpoint, in the policy's rank processes with its layout and ``trainer.optimizer`` settings."""

    lr: float | None = None
    """Peak learning rate of the critic; null takes ``trainer.optimizer.lr`` (PPO recipes usually set ~10x)."""
    value_clip: float | None = 0.2
    """PPO value clip around the old values; null for the plain squared error."""
    head_init_std: float = 0.0
    """Std of the value head's initial weights; 0 starts every value at 0."""

    def __post_init__(self) -> None:
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"critic.lr: must be > 0 or null, got {self.lr}")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ValueError(f"critic.value_clip: must be > 0 or null, got {self.value_clip}")
        if self.head_init_std < 0:
            raise ValueError(f"critic.head_init_std: must be >= 0, got {self.head_init_std}")

    def trainer_config(self, trainer: "TrainerConfig") -> "TrainerConfig":
        """The policy's trainer settings with the critic's learning rate."""
        if self.lr is None:
            return trainer
        optimizer = dataclasses.replace(trainer.optimizer, lr=self.lr, min_lr=min(trainer.optimizer.min_lr, self.lr))
        return dataclasses.replace(trainer, optimizer=optimizer)


@dataclass
class TrainerConfig:
    """The Megatron policy worker (``trainer``)."""

    num_ranks: int = 1
    """Trainer processes (one per GPU); data parallel takes what tensor x pipeline leave."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Parallel layout."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and learning-rate schedule."""
    dtype: str = "float32"
    """Parameter and compute dtype: float32 or bfloat16 (optimizer master weights stay float32)."""
    max_tokens_per_micro_batch: int = 8192
    """Dynamic batching: padded tokens (rows x longest row) per micro-batch per rank."""
    use_transformer_engine: bool = False
    """Layer spec: False (default, CPU and GPU) for the fast local modules (SDPA/varlen attention, grouped-GEMM
    experts; 41.8% MFU dense on an H200), True for Transformer Engine (the ``te`` extra; not measured here)."""
    attention_backend: str = "sdpa"
    """Without TE: sdpa (the fast spec) or local (megatron-core's own unfused local spec)."""
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    """Activation recompute: off by default."""

    def __post_init__(self) -> None:
        _require(self.num_ranks >= 1, "trainer.num_ranks", f"must be >= 1, got {self.num_ranks}")
        self.parallel.check_world(self.num_ranks)
        _require(self.dtype in _DTYPES, "trainer.dtype", f"{self.dtype!r} is not one of {_DTYPES}")
        _require(
            self.max_tokens_per_micro_batch > 0,
            "trainer.max_tokens_per_micro_batch",
            f"must be > 0, got {self.max_tokens_per_micro_batch}",
        )
        _require(
            self.attention_backend in ("sdpa", "local"),
            "trainer.attention_backend",
            f"unknown {self.attention_backend!r}; known: sdpa, local",
        )
