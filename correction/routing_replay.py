"""Routing-replay policy data: which experts each token was routed to, per MoE layer.

R3 (rollout routing replay) replays the experts the sampler chose; R2 replays the experts the
trainer recorded in its own old-log-prob pass. Either way the record is the same object: integer
expert ids of shape ``[num_tokens, num_moe_layers, topk]``. This module holds the record, its
validation and a compact JSON-safe form for the ledger; the hooks that apply it live in
``parallel/``.
"""

from __future__ import annotations

import base64
import enum
from dataclasses import dataclass

import torch

_INT16_MAX_EXPERTS = 2**15


class RoutingReplayMode(str, enum.Enum):
    """Which routing the trainer's forward passes replay.

    Members are named by their values: Hydra/OmegaConf match enum overrides by member name, so
    ``algorithm.routing_replay.mode=r3`` works on the command line.
    """

    none = "none"
    r2 = "r2"
    r3 = "r3"


@dataclass
class RoutingReplayConfig:
    """Routing replay for MoE policies (``algorithm.routing_replay``)."""

    mode: RoutingReplayMode = RoutingReplayMode.none
    """none: route freely; r2: replay the trainer's old-log-prob routing; r3: replay the sampler's."""

    def __post_init__(self) -> None:
        try:
            self.mode = RoutingReplayMode(self.mode)
        except ValueError:
            known = ", ".join(m.value for m in RoutingReplayMode)
            raise ValueError(
                f"algorithm.routing_replay.mode: unknown mode {self.mode!r}; known: {known}"
            ) from None


@dataclass
class RoutedExperts:
    """Routed expert ids per token and MoE layer, as chosen by a sampler (R3) or trainer (R2)."""

    indices: torch.Tensor
    """Integer expert ids, shape ``[num_tokens, num_moe_layers, topk]``."""
    num_experts: int
    """Experts per MoE layer; every id lies in ``[0, num_experts)``."""

    @property
    def num_tokens(self) -> int:
        return int(self.indices.shape[0])

    @property
    def num_moe_layers(self) -> int:
        return int(self.indices.shape[1])

    @property
    def topk(self) -> int:
        return int(self.indices.shape[2])

    def validate(
        self,
        num_tokens: int,
        where: str,
        *,
        num_moe_layers: int | None = None,
        topk: int | None = None,
    ) -> None:
        """Raise ``ValueError`` naming ``where`` unless this record fits ``num_tokens`` tokens."""
        idx = self.indices
        if not isinstance(idx, torch.Tensor):
            raise ValueError(f"{where}: routed experts must be a torch.Tensor, got {type(idx)}")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"{where}: routed expert ids must be integers, got dtype {idx.dtype}")
        if idx.dim() != 3:
            raise ValueError(
                f"{where}: routed experts must have shape [num_tokens, num_moe_layers, topk], "
                f"got {tuple(idx.shape)}"
            )
        if not isinstance(self.num_experts, int) or self.num_experts < 1:
            raise ValueError(f"{where}: num_experts must be a positive int, got {self.num_experts!r}")
        if idx.shape[0] != num_tokens:
            raise ValueError(
                f"{where}: routed experts cover {idx.shape[0]} tokens but the trajectory has "
                f"{num_tokens}"
            )
        _check_expected(where, "num_moe_layers", self.num_moe_layers, num_moe_layers)
        _check_expected(where, "topk", self.topk, topk)
        if self.topk > self.num_experts:
            raise ValueError(f"{where}: topk {self.topk} exceeds num_experts {self.num_experts}")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.num_experts):
            raise ValueError(
                f"{where}: expert id out of [0, {self.num_experts}): "
                f"min {int(idx.min())}, max {int(idx.max())}"
            )
        if self.topk > 1 and idx.numel():
            ordered = idx.sort(dim=-1).values
            if bool((ordered[..., 1:] == ordered[..., :-1]).any()):
                raise ValueError(f"{where}: a token lists the same expert twice in one layer's top-k")

    def to_compact(self) -> dict:
        """JSON-safe form: shape, num_experts, storage dtype and base64 of the raw bytes.

        Ids are stored as uint8 when ``num_experts <= 256``, else as little-endian int16.
        """
        if self.num_experts > _INT16_MAX_EXPERTS:
            raise ValueError(
                f"routed experts: num_experts {self.num_experts} exceeds the compact int16 range"
            )
        flat = self.indices.reshape(-1).to(torch.int64)
        if self.num_experts <= 256:
            dtype, raw = "uint8", flat.to(torch.uint8)
        else:
            dtype, raw = "int16", torch.stack([flat & 0xFF, flat >> 8], dim=-1).to(torch.uint8)
        return {
            "shape": list(self.indices.shape),
            "num_experts": self.num_experts,
            "dtype": dtype,
            "data": base64.b64encode(raw.contiguous().numpy().tobytes()).decode("ascii"),
        }

    @classmethod
    def from_compact(cls, d: dict) -> RoutedExperts:
        """Inverse of :meth:`to_compact`; ids come back as ``torch.int64``."""
        raw = base64.b64decode(d["data"], validate=True)
        shape = [int(s) for s in d["shape"]]
        count = 1
        for s in shape:
            count *= s
        width = {"uint8": 1, "int16": 2}.get(d["dtype"])
        if width is None:
            raise ValueError(f"routed experts: unknown compact dtype {d['dtype']!r}")
        if len(raw) != count * width:
            raise ValueError(
                f"routed experts: {len(raw)} bytes do not hold shape {shape} as {d['dtype']}"
            )
        data = torch.zeros(0, dtype=torch.int64)
        if raw:
            data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)
        if width == 2:
            pairs = data.reshape(-1, 2)
            data = pairs[:, 0] | (pairs[:, 1] << 8)
        return cls(indices=data.reshape(shape), num_experts=int(d["num_experts"]))


def _check_expected(where: str, name: str, actual: int, expected: int | None) -> None:
    if expected is not None and actual != expected:
        raise ValueError(f"{where}: routed experts have {name}={actual}, expected {expected}")
