"""What a schedule drives: the rooms behind small interfaces, built once per run by ``job.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from megatron_rl.config.schema import TrainConfig
from megatron_rl.contracts import PromptItem, TrainingBatch
from megatron_rl.data.sampler import PromptSampler
from megatron_rl.generator.generator import Generator
from megatron_rl.run_folder import RunFolder
from megatron_rl.tracking import Tracker


class Policy(Protocol):
    """The trainer (a Megatron worker group), with its optional reference policy and critic."""

    def compute_logprobs(self, batch: TrainingBatch) -> tuple[torch.Tensor, torch.Tensor, object]:
        """(log-probs, entropy, routed experts or None): ``[B, T]`` aligned with ``input_ids``."""

    def train_step(self, batch: TrainingBatch, algorithm=None, lr: float | None = None) -> dict[str, float]:
        """One optimizer step over the batch (micro-batched inside); ``algorithm`` overrides the loss, ``lr``
        the learning rate (constant, outside the trainer's schedule)."""

    def compute_ref_logprobs(self, batch: TrainingBatch) -> torch.Tensor:
        """The reference policy's ``[B, T]`` log-probs (when the group has one)."""

    def snapshot_reference(self) -> None:
        """Reference := the policy's current weights."""

    def compute_values(self, batch: TrainingBatch) -> torch.Tensor:
        """The critic's ``[B, T]`` values (when the group has one)."""

    def critic_step(self, batch: TrainingBatch, returns: torch.Tensor, old_values: torch.Tensor) -> dict[str, float]:
        """One critic update."""

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


class WeightSync(Protocol):
    """Moves the trainer's weights to every replica and checks each reports ``version``."""

    async def __call__(self, version: int) -> dict[str, float]: ...


@dataclass
class LoopState:
    """What a checkpoint must hold besides the trainer for a resumed run to continue exactly."""

    step: int = 0
    """Steps finished."""
    version: int = 0
    """Weight version the fleet serves."""
    data: dict = field(default_factory=dict)
    """The training prompt sampler's position."""
    async_state: dict = field(default_factory=dict)
    """fully_async: admission counts and the prompts drawn but neither trained nor filtered."""


@dataclass
class Components:
    config: TrainConfig
    generator: Generator
    policy: Policy
    weight_sync: WeightSync
    train_data: PromptSampler
    eval_prompts: list[PromptItem]
    folder: RunFolder
    tracker: Tracker
    pad_token_id: int
