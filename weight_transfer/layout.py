"""The trainer's parallel layout and where each HF tensor lives in it (pipeline stage, expert rank, TP split).

Ranks follow Megatron's default order ``tp-cp-ep-dp-pp`` with cp = 1. Dense tensors: the TP rank varies fastest,
then the data-parallel rank, then the pipeline stage. Routed experts fold the same ranks of a stage differently
(megatron's expert rank generator): the expert-TP rank varies fastest, then the expert-parallel rank, then the
expert-data-parallel rank, so with ETP = TP an expert's TP group is that of data-parallel rank = its expert rank.
"""

from __future__ import annotations

import math
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
    etp: int | None = None
    """Expert-tensor-parallel size (ranks splitting each routed expert's matrices); None means ``tp``."""

    def __post_init__(self):
        for key in ("num_layers", "tp", "pp", "dp", "ep", "expert_tp"):
            if getattr(self, key) < 1:
                raise ValueError(f"weight_transfer.layout.{key}={getattr(self, key)}: must be >= 1")
        if self.pp > self.num_layers:
            raise ValueError(f"weight_transfer.layout.pp={self.pp}: more stages than num_layers={self.num_layers}")
        if (self.tp * self.dp) % (self.expert_tp * self.ep):
            raise ValueError(f"weight_transfer.layout: etp x ep = {self.expert_tp} x {self.ep} must divide the "
                             f"{self.tp * self.dp} ranks of a stage (tp x dp = {self.tp} x {self.dp}); change etp or ep")
        if self.ep > 1 and (self.num_experts == 0 or self.num_experts % self.ep):
            raise ValueError(f"weight_transfer.layout.ep={self.ep}: must divide num_experts={self.num_experts}")

    @property
    def expert_tp(self) -> int:
        """Ranks splitting each routed expert (``etp``, or ``tp`` when unset)."""
        return self.tp if self.etp is None else self.etp

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage (tp x dp)."""
        return self.tp * self.dp

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    def stage_of(self, name: str) -> int:
        """Pipeline stage holding ``name``: its layer's stage; embeddings first, final norm and head last."""
        layer = _LAYER.search(name)
        if layer:
            return int(layer.group(1)) * self.pp // self.num_layers
        return 0 if "embed_tokens" in name else self.pp - 1

    def is_expert(self, name: str) -> bool:
        """Whether ``name`` is a routed expert's tensor (shared experts are dense)."""
        return self.num_experts > 0 and _EXPERT.search(name) is not None

    def expert_rank_of(self, name: str) -> int:
        """Expert-parallel rank holding ``name`` (0 for tensors that are not routed experts)."""
        expert = _EXPERT.search(name) if self.ep > 1 else None
        return int(expert.group(1)) // (self.num_experts // self.ep) if expert else 0

    def tp_group(self, name: str) -> list[int]:
        """Global ranks of the (expert-)TP group that holds ``name`` on expert/data-parallel rank 0 of its stage:
        the ranks that export it, TP rank 0 first."""
        first = self.stage_of(name) * self.stage_ranks
        if self.is_expert(name):
            first += self.expert_tp * self.expert_rank_of(name)
            return list(range(first, first + self.expert_tp))
        return list(range(first, first + self.tp))

    @property
    def replica_ranks(self) -> int:
        """Ranks of a stage that together hold every tensor of it once: both the dense TP groups and the routed
        experts' (expert-TP x EP) groups repeat with this period (TP x EP when ETP = TP)."""
        return math.lcm(self.tp, self.expert_tp * self.ep)

    def holders(self, name: str) -> list[int]:
        """Global ranks among the first ``replica_ranks`` of ``name``'s stage that hold it or a TP shard of it."""
        first = self.stage_of(name) * self.stage_ranks
        if not self.is_expert(name):
            return list(range(first, first + self.replica_ranks))
        expert_rank = self.expert_rank_of(name)
        return [first + i for i in range(self.replica_ranks) if i // self.expert_tp % self.ep == expert_rank]



def tp_split_dim(name: str) -> int | None:
    """The dimension split across TP ranks for ``name``, or None when every TP rank holds all of it."""
    return TP_SPLIT_DIM.get(".".join(name.rsplit(".", 2)[-2:]))
