"""Trainer side: stream one rank's (hf_name, tensor) pairs into its planned buckets and send each bucket as
soon as it is full, in plan order. Returns the checksums the coordinator compares with the replicas'."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from weight_transfer.buckets import Bucket, check_slot, unpack_views, zero_padding
from weight_transfer.checksum import checksum_text, checksum_words, tensor_digest
from weight_transfer.plan import TransferPlan
from weight_transfer.transports.base import SenderTransport


class _OpenBucket:
    """A bucket being filled: each tensor is checked and copied into its slot as it comes. (Batching the
    small ones into one ``_foreach_copy_`` per bucket measured the same on the H200: 7B-sized tensor sets
    53-56% of a D2D copy either way.)"""

    def __init__(self, bucket: Bucket, flat: torch.Tensor):
        self.bucket, self.flat = bucket, flat
        zero_padding(bucket, flat)
        self.slots = {s.name: s for s in bucket.slots}
        self.views = dict(zip(self.slots, unpack_views(bucket, flat)))

    def add(self, name: str, tensor: torch.Tensor) -> bool:
        """Copy ``name``'s tensor in; True when the bucket is complete."""
        view = self.views.pop(name, None)
        if view is None:
            raise ValueError(f"{name}: the trainer gave it twice in one export")
        check_slot(self.slots[name], tensor)
        view.copy_(tensor)
        return not self.views


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
    where = plan.bucket_of_tensor
    open_: dict[int, _OpenBucket] = {}
    full: dict[int, _OpenBucket] = {}  # complete, waiting for the buckets before them to be sent
    order = iter(mine)
    next_bucket = next(order, None)
    sums: dict[int, torch.Tensor] = {}  # bucket index -> checksum words, still on the device
    tensors = {}
    for name, tensor in weights:
        bucket = where.get(name)
        if bucket is None:
            raise ValueError(f"{name}: not in transfer plan {plan.fingerprint}; rebuild the plan for the current layout")
        if bucket.sender != rank:
            continue
        if bucket.index in full or bucket.index in sums:  # already complete (waiting, or sent)
            raise ValueError(f"{name}: the trainer gave it twice in one export")
        filling = open_.get(bucket.index) or open_.setdefault(
            bucket.index, _OpenBucket(bucket, transport.buffer(bucket, device)))
        if digests:
            tensors[name] = tensor_digest(tensor)
        if filling.add(name, tensor):
            full[bucket.index] = open_.pop(bucket.index)
        while next_bucket is not None and next_bucket.index in full:
            done = full.pop(next_bucket.index)
            sums[done.bucket.index] = checksum_words(done.flat)
            transport.send(version, done.bucket, done.flat)
            next_bucket = next(order, None)
    if next_bucket is not None:
        missing = sorted(n for b in open_.values() for n in b.views) or [s.name for s in next_bucket.slots]
        raise ValueError(f"rank {rank}: the trainer never gave {missing[:5]} (plan {plan.fingerprint})")
    if transport is not None:
        transport.finish(version)
    nbytes = {b.index: b.nbytes for b in mine}
    return {"buckets": {index: checksum_text(nbytes[index], words) for index, words in sums.items()},
            "tensors": tensors}
