"""The transfer plan: every inference-side tensor, the trainer shards that compose it, the rank that sends
it, and the bucket (and offset) it travels in. Printable, JSON round-trippable, fingerprinted."""

from __future__ import annotations

import gc
import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cached_property

import torch

from weight_transfer.buckets import Bucket, Slot, assign_buckets, torch_dtype
from weight_transfer.layout import TrainerLayout, tp_split_dim

SENDER_RULES = ("owner", "spread")
_ELEMENT_SIZE: dict[str, int] = {}


def element_size(dtype: str) -> int:
    """Bytes per element of a dtype name (cached: plans of DeepSeek-V3 size ask ~10^5 times)."""
    size = _ELEMENT_SIZE.get(dtype)
    if size is None:
        size = _ELEMENT_SIZE[dtype] = torch.empty((), dtype=torch_dtype(dtype)).element_size()
    return size


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as the inference side loads it: HF checkpoint name, shape, dtype name (e.g. ``bfloat16``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @cached_property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * element_size(self.dtype)


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


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """A plan allocates several small objects per tensor and no cycles; without this, the cyclic collector
    rescans the growing heap over and over (half the build time at ~45k tensors)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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
        self._json: str | None = None
        self.fingerprint = hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def build(cls, specs: list[TensorSpec], layout: TrainerLayout, bucket_bytes: int,
              senders: str = "owner") -> TransferPlan:
        """Place every spec on its TP group, choose the rank that sends it, and bucket per sender.

        ``senders`` must match what the trainer's export iterator yields on each rank: ``owner`` (the
        first rank of the TP group sends the whole tensor, as ``parallel.weights.hf_export`` yields it
        after gathering the TP shards) or ``spread`` (the least-loaded member sends it, for exporters that
        yield every tensor on every TP rank, e.g. a checkpoint read per process).
        """
        if senders not in SENDER_RULES:
            raise ValueError(f"transfer plan: senders={senders!r}; use one of {SENDER_RULES}")
        names = {s.name for s in specs}
        if len(names) != len(specs):
            raise ValueError("transfer plan: duplicate tensor names in the inference-side specs")
        load: dict[int, int] = {}
        entries = []
        with _no_cyclic_gc():
            for spec in sorted(specs, key=lambda s: natural_key(s.name)):
                group = layout.tp_group(spec.name)
                sender = group[0] if senders == "owner" else min(group, key=lambda r: (load.get(r, 0), r))
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

    @cached_property
    def bucket_of_tensor(self) -> dict[str, Bucket]:
        """HF tensor name -> the bucket that carries it (built once per plan, used every update)."""
        return {s.name: b for b in self.buckets for s in b.slots}

    def to_json(self) -> str:
        """Compact JSON: entries as ``[name, shape, dtype, sender, shards]``, bucket slots as ``[name, offset]``
        (shape and dtype come from the entry). Linear in the tensor count; ~45k tensors take well under 1 s."""
        if self._json is None:
            entries = [[e.spec.name, list(e.spec.shape), e.spec.dtype, e.sender,
                        [[s.rank, s.dim, s.start, s.stop] for s in e.shards]] for e in self.entries]
            buckets = [[b.index, b.sender, b.nbytes, [[s.name, s.offset] for s in b.slots]] for b in self.buckets]
            self._json = json.dumps({"format": 2, "layout": asdict(self.layout), "entries": entries,
                                     "buckets": buckets}, sort_keys=True, separators=(",", ":"))
        return self._json

    @classmethod
    def from_json(cls, text: str) -> TransferPlan:
        with _no_cyclic_gc():
            return cls._from_raw(json.loads(text))

    @classmethod
    def _from_raw(cls, raw: dict) -> TransferPlan:
        if raw.get("format") != 2:
            raise ValueError("transfer plan: JSON from another version of weight_transfer; rebuild the plan")
        entries = [PlanEntry(TensorSpec(name, tuple(shape), dtype), sender, tuple(Shard(*s) for s in shards))
                   for name, shape, dtype, sender, shards in raw["entries"]]
        specs = {e.spec.name: e.spec for e in entries}
        buckets = [Bucket(index, sender, nbytes, tuple(Slot(n, off, specs[n].shape, specs[n].dtype, specs[n].nbytes)
                                                       for n, off in slots))
                   for index, sender, nbytes, slots in raw["buckets"]]
        return cls(TrainerLayout(**raw["layout"]), entries, buckets)

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
