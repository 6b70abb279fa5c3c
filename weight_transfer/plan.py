"""The transfer plan: every inference-side tensor, the trainer shards that compose it, the rank that sends
it, and the bucket (and offset) it travels in. Printable, JSON round-trippable, fingerprinted."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass

import torch

from weight_transfer.buckets import Bucket, assign_buckets, torch_dtype
from weight_transfer.layout import TrainerLayout, tp_split_dim


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as the inference side loads it: HF checkpoint name, shape, dtype name (e.g. ``bfloat16``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * torch.empty((), dtype=torch_dtype(self.dtype)).element_size()


@dataclass(frozen=True)
class Shard:
    """A trainer rank's piece of a tensor: rows/columns [start, stop) of ``dim``, or all of it (dim None)."""

    rank: int
    dim: int | None
    start: int
    stop: int


@dataclass(frozen=True)
class PlanEntry:
    spec: TensorSpec
    sender: int
    shards: tuple[Shard, ...]


def specs_from_tensors(named: dict[str, torch.Tensor]) -> list[TensorSpec]:
    """Specs of a name -> tensor mapping (e.g. a checkpoint read on the meta device)."""
    return [TensorSpec(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named.items()]


def natural_key(name: str) -> list:
    """Sort key that orders ``layers.2`` before ``layers.10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _shards(spec: TensorSpec, group: list[int]) -> tuple[Shard, ...]:
    dim = tp_split_dim(spec.name)
    if dim is None or len(group) == 1:
        return (Shard(group[0], None, 0, spec.shape[0] if spec.shape else 1),)
    size = spec.shape[dim]
    if size % len(group):
        raise ValueError(f"{spec.name}: dim {dim} of size {size} does not split over TP={len(group)}")
    step = size // len(group)
    return tuple(Shard(r, dim, i * step, (i + 1) * step) for i, r in enumerate(group))


class TransferPlan:
    """Entries in send order and their buckets; ``fingerprint`` names this exact plan."""

    def __init__(self, layout: TrainerLayout, entries: list[PlanEntry], buckets: list[Bucket]):
        self.layout, self.entries, self.buckets = layout, entries, buckets
        self.fingerprint = hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def build(cls, specs: list[TensorSpec], layout: TrainerLayout, bucket_bytes: int) -> TransferPlan:
        """Place every spec on its TP group, pick the least-loaded member to send it, and bucket per sender."""
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError("transfer plan: duplicate tensor names in the inference-side specs")
        load: dict[int, int] = {}
        entries = []
        for spec in sorted(specs, key=lambda s: natural_key(s.name)):
            group = layout.tp_group(spec.name)
            sender = min(group, key=lambda r: (load.get(r, 0), r))
            load[sender] = load.get(sender, 0) + spec.nbytes
            entries.append(PlanEntry(spec, sender, _shards(spec, group)))
        return cls(layout, entries, assign_buckets(entries, bucket_bytes))

    @property
    def senders(self) -> list[int]:
        return sorted({b.sender for b in self.buckets})

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def buckets_of(self, rank: int) -> list[Bucket]:
        return [b for b in self.buckets if b.sender == rank]

    def to_json(self) -> str:
        return json.dumps({"layout": asdict(self.layout),
                           "entries": [asdict(e) for e in self.entries],
                           "buckets": [b.to_dict() for b in self.buckets]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TransferPlan:
        raw = json.loads(text)
        entries = [PlanEntry(TensorSpec(e["spec"]["name"], tuple(e["spec"]["shape"]), e["spec"]["dtype"]),
                             e["sender"], tuple(Shard(**s) for s in e["shards"])) for e in raw["entries"]]
        return cls(TrainerLayout(**raw["layout"]), entries, [Bucket.from_dict(b) for b in raw["buckets"]])

    def format(self) -> str:
        """Human-readable plan: per bucket its sender and tensors with shards."""
        lines = [f"transfer plan {self.fingerprint}: {len(self.entries)} tensors, {len(self.buckets)} buckets, "
                 f"{self.nbytes / 2**20:.1f} MiB, senders {self.senders}"]
        by_name = {e.spec.name: e for e in self.entries}
        for b in self.buckets:
            lines.append(f"bucket {b.index} from rank {b.sender}: {b.nbytes} bytes")
            for slot in b.slots:
                shards = " + ".join(_shard_text(s) for s in by_name[slot.name].shards)
                lines.append(f"  {slot.name} {list(slot.shape)} {slot.dtype} @{slot.offset} <- {shards}")
        return "\n".join(lines)


def _shard_text(s: Shard) -> str:
    return f"r{s.rank}" if s.dim is None else f"r{s.rank}[dim{s.dim} {s.start}:{s.stop}]"
