"""The trainer's parallel layout and where each HF tensor lives in it (pipeline stage, expert rank, TP split).

Ranks follow Megatron's default order ``tp-cp-ep-dp-pp`` with cp = 1: the TP rank varies fastest, then the
data-parallel rank (whose low part is the expert-parallel rank), then the pipeline stage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAYER = re.compile(r"\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")

# HF name suffix (last two dotted parts) -> the dimension Megatron splits across TP ranks (column-parallel 0, row-parallel 1).
# Anything not listed (norms, router gate) is replicated on every TP rank.
TP_SPLIT_DIM = {
    "embed_tokens.weight": 0, "lm_head.weight": 0,
    "q_proj.weight": 0, "k_proj.weight": 0, "v_proj.weight": 0,
    "q_proj.bias": 0, "k_proj.bias": 0, "v_proj.bias": 0,
    "gate_proj.weight": 0, "up_proj.weight": 0,
    "o_proj.weight": 1, "down_proj.weight": 1,
}


@dataclass(frozen=True)
class TrainerLayout:
    """Trainer parallel sizes plus the model facts placement needs."""

    num_layers: int
    """Decoder layers in the model (split contiguously over pipeline stages, as evenly as possible)."""
    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    dp: int = 1
    """Data-parallel size (a multiple of ep: expert ranks live inside the data-parallel dimension)."""
    ep: int = 1
    """Expert-parallel size."""
    num_experts: int = 0
    """Routed experts per MoE layer (0 for dense models)."""

    def __post_init__(self):
        for key in ("num_layers", "tp", "pp", "dp", "ep"):
            if getattr(self, key) < 1:
                raise ValueError(f"weight_transfer.layout.{key}={getattr(self, key)}: must be >= 1")
        if self.pp > self.num_layers:
            raise ValueError(f"weight_transfer.layout.pp={self.pp}: more stages than num_layers={self.num_layers}")
        if self.dp % self.ep:
            raise ValueError(f"weight_transfer.layout.ep={self.ep}: must divide dp={self.dp}")
        if self.ep > 1 and (self.num_experts == 0 or self.num_experts % self.ep):
            raise ValueError(f"weight_transfer.layout.ep={self.ep}: must divide num_experts={self.num_experts}")

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    def rank(self, tp_rank: int, dp_rank: int, pp_stage: int) -> int:
        return tp_rank + self.tp * (dp_rank + self.dp * pp_stage)

    def stage_of(self, name: str) -> int:
        """Pipeline stage holding ``name``: its layer's stage; embeddings first, final norm and head last."""
        layer = _LAYER.search(name)
        if layer:
            return int(layer.group(1)) * self.pp // self.num_layers
        return 0 if "embed_tokens" in name else self.pp - 1

    def expert_rank_of(self, name: str) -> int:
        """Expert-parallel rank holding ``name`` (0 for tensors that are not routed experts)."""
        expert = _EXPERT.search(name) if self.ep > 1 else None
        return int(expert.group(1)) // (self.num_experts // self.ep) if expert else 0

    def tp_group(self, name: str) -> list[int]:
        """Global ranks of the TP group that holds ``name`` (its stage, its expert rank as dp rank)."""
        stage, dp_rank = self.stage_of(name), self.expert_rank_of(name)
        return [self.rank(t, dp_rank, stage) for t in range(self.tp)]


def tp_split_dim(name: str) -> int | None:
    """The dimension split across TP ranks for ``name``, or None when every TP rank holds all of it."""
    return TP_SPLIT_DIM.get(".".join(name.rsplit(".", 2)[-2:]))
