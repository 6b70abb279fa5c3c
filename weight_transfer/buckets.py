"""Flat buckets: tensors packed at aligned byte offsets into one uint8 buffer, with the metadata to unpack."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import torch

ALIGN = 64


@functools.cache
def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Slot:
    """Where one tensor sits in its bucket."""

    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    """One flat buffer sent by one trainer rank; ``index`` is its place in the global send order."""

    index: int
    sender: int
    nbytes: int
    slots: tuple[Slot, ...]


def assign_buckets(entries, bucket_bytes: int) -> list[Bucket]:
    """Fill buckets per sender in entry order; interleave senders round-robin for the global order."""
    per_sender: dict[int, list[list[Slot]]] = {}
    for entry in entries:
        spec = entry.spec
        groups = per_sender.setdefault(entry.sender, [[]])
        used = _align(groups[-1][-1].offset + groups[-1][-1].nbytes) if groups[-1] else 0
        if groups[-1] and used + spec.nbytes > bucket_bytes:
            groups.append([])
            used = 0
        groups[-1].append(Slot(spec.name, used, spec.shape, spec.dtype, spec.nbytes))
    ordered = []
    rounds = max((len(g) for g in per_sender.values()), default=0)
    for k in range(rounds):
        for sender in sorted(per_sender):
            if k < len(per_sender[sender]):
                slots = per_sender[sender][k]
                ordered.append((sender, slots))
    return [Bucket(i, sender, _align(slots[-1].offset + slots[-1].nbytes), tuple(slots))
            for i, (sender, slots) in enumerate(ordered)]


def pack(bucket: Bucket, tensors: Mapping[str, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy each slot's tensor into ``out`` (uint8, bucket.nbytes, any device); shape and dtype must match."""
    if out.dtype != torch.uint8 or out.numel() != bucket.nbytes:
        raise ValueError(f"bucket {bucket.index}: buffer must be uint8 of {bucket.nbytes} bytes")
    zero_padding(bucket, out)
    for slot in bucket.slots:
        tensor = tensors[slot.name]
        check_slot(slot, tensor)
        slot_view(slot, out, tensor.shape).copy_(tensor)
    return out


def check_slot(slot: Slot, tensor: torch.Tensor) -> None:
    """Refuse a trainer tensor whose shape or dtype the plan did not expect. Besides the slot's shape
    ``[rows, ...]`` a tensor may come as row blocks, ``[blocks, rows / blocks, ...]``: read in row-major
    order its bytes are the slot's (:func:`parallel.weights.layout.split_qkv_blocks` exports q, k and v so)."""
    shape = tensor.shape
    if tensor.dtype != torch_dtype(slot.dtype) or (shape != slot.shape and not _row_blocks(shape, slot.shape)):
        raise ValueError(f"{slot.name}: trainer gives {tuple(tensor.shape)} {tensor.dtype}, the plan says "
                         f"{slot.shape} {slot.dtype}; rebuild the plan for the current layout")


def _row_blocks(shape: torch.Size, want: tuple[int, ...]) -> bool:
    return len(want) >= 1 and len(shape) == len(want) + 1 and shape[0] * shape[1] == want[0] and shape[2:] == want[1:]


def zero_padding(bucket: Bucket, flat: torch.Tensor) -> None:
    """Zero the alignment gaps between slots (and after the last), so a bucket's checksum depends only
    on its tensors; the slots themselves are overwritten by packing, so they are left alone."""
    end = 0
    for slot in (*bucket.slots, Slot("", bucket.nbytes, (), "uint8", 0)):
        if slot.offset > end:
            flat[end:slot.offset].zero_()
        end = slot.offset + slot.nbytes


def slot_view(slot: Slot, flat: torch.Tensor, shape=None) -> torch.Tensor:
    """The view of ``flat`` where ``slot``'s tensor sits, with its dtype and shape (or ``shape``, one
    :func:`check_slot` accepts) (no copy)."""
    return flat[slot.offset:slot.offset + slot.nbytes].view(torch_dtype(slot.dtype)).view(shape or slot.shape)


def unpack(bucket: Bucket, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(name, view into ``flat`` with the slot's shape and dtype) per slot (no copy)."""
    return [(s.name, slot_view(s, flat)) for s in bucket.slots]
