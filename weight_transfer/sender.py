"""Trainer side: stream one rank's (hf_name, tensor) pairs into its planned buckets and send each bucket as
soon as it is full, in plan order. Returns the checksums the coordinator compares with the replicas'."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from weight_transfer.buckets import Bucket, copy_into, unpack_views, zero_padding
from weight_transfer.checksum import bucket_checksum, tensor_digest
from weight_transfer.plan import TransferPlan
from weight_transfer.transports.base import SenderTransport


class _OpenBucket:
    def __init__(self, bucket: Bucket, flat: torch.Tensor):
        self.bucket, self.flat = bucket, flat
        zero_padding(bucket, flat)
        self.slots = {s.name: s for s in bucket.slots}
        self.views = dict(zip(self.slots, unpack_views(bucket, flat)))
        self.missing = {s.name for s in bucket.slots}


def send_weights(plan: TransferPlan, rank: int, weights: Iterable[tuple[str, torch.Tensor]],
                 transport: SenderTransport | None, version: int, device: torch.device,
                 digests: bool = False) -> dict:
    """Send ``rank``'s buckets of ``plan``; tensors the plan gives to other ranks are skipped.

    The iterator is always exhausted (an exporter's collectives need every rank); a rank the plan gives no
    bucket may pass ``transport=None``.

    Returns ``{"buckets": {index: checksum}, "tensors": {name: sha256}}`` (tensors only when ``digests``).
    Raises ValueError for a name the plan lacks or a planned tensor the iterator never yielded.
    """
    mine = plan.buckets_of(rank)
    if mine and transport is None:
        raise ValueError(f"rank {rank}: sends {len(mine)} buckets of plan {plan.fingerprint} but has no transport")
    where = {s.name: b for b in plan.buckets for s in b.slots}
    open_: dict[int, _OpenBucket] = {}
    full: dict[int, _OpenBucket] = {}
    order = iter(mine)
    next_bucket = next(order, None)
    out = {"buckets": {}, "tensors": {}}
    for name, tensor in weights:
        bucket = where.get(name)
        if bucket is None:
            raise ValueError(f"{name}: not in transfer plan {plan.fingerprint}; rebuild the plan for the current layout")
        if bucket.sender != rank:
            continue
        slot_bucket = open_.get(bucket.index) or open_.setdefault(
            bucket.index, _OpenBucket(bucket, transport.buffer(bucket, device)))
        copy_into(slot_bucket.slots[name], slot_bucket.views[name], tensor)
        slot_bucket.missing.discard(name)
        if digests:
            out["tensors"][name] = tensor_digest(tensor)
        if not slot_bucket.missing:
            full[bucket.index] = open_.pop(bucket.index)
        while next_bucket is not None and next_bucket.index in full:
            done = full.pop(next_bucket.index)
            out["buckets"][done.bucket.index] = bucket_checksum(done.flat)
            transport.send(version, done.bucket, done.flat)
            next_bucket = next(order, None)
    if next_bucket is not None:
        missing = sorted(n for b in open_.values() for n in b.missing) or [s.name for s in next_bucket.slots]
        raise ValueError(f"rank {rank}: the trainer never gave {missing[:5]} (plan {plan.fingerprint})")
    if transport is not None:
        transport.finish(version)
    return out
