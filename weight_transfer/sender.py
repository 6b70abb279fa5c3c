"""Trainer side: stream one rank's (hf_name, tensor) pairs into its planned buckets and send each bucket as
soon as it is full, in plan order. Returns the checksums the coordinator compares with the replicas'.

An export whose tensors are views of the trainer's parameters reads the same addresses every update; it
says so with a ``static_key`` (see :class:`parallel.weights.hf_export.ExportedTensors`). Its CUDA pack is
then recorded once, one launch per bucket, and replayed while the key stays the same: the kernel launches
alone (one CUDA graph where the buffers repeat, :class:`weight_transfer.fused_pack.Replay`), without the
export's and the packing's Python per tensor (on the H200 that host work, not the copy, set the pace of a
1B model's send). The full key costs 0.1-0.16 ms of a 1B model's 1.5 ms send to build,
so the replay starts on the export's ``addresses`` (the parameters' addresses, a tenth of that) and the
key is compared while the GPU packs; a mismatch packs afresh before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from weight_transfer import fused_pack
from weight_transfer.buckets import Bucket, check_slot, slot_view, zero_padding
from weight_transfer.checksum import checksum_texts, checksum_words, tensor_digest
from weight_transfer.plan import TransferPlan
from weight_transfer.transports.base import SenderTransport


class _OpenBucket:
    """A bucket being filled: each tensor is checked as it comes, then copied into its slot (on CUDA by
    the fused copy-and-checksum kernel, in groups; elsewhere at once by ``copy_``)."""

    def __init__(self, bucket: Bucket, flat: torch.Tensor):
        self.bucket, self.flat = bucket, flat
        zero_padding(bucket, flat)
        self.slots = {s.name: s for s in bucket.slots}
        self.fused = fused_pack.FusedPack(flat) if fused_pack.usable(flat) else None

    def add(self, name: str, tensor: torch.Tensor) -> bool:
        """Copy ``name``'s tensor in; True when every slot has its tensor."""
        slot = self.slots.pop(name, None)
        if slot is None:
            raise ValueError(f"{name}: the trainer gave it twice in one export")
        check_slot(slot, tensor)
        if self.fused is not None:
            self.fused.add(slot, tensor)
        else:
            slot_view(slot, self.flat, tensor.shape).copy_(tensor)
        return not self.slots

    def checksum_words(self) -> torch.Tensor:
        """The bucket's checksum words once every slot is filled (the fused path copies its last group here)."""
        return self.fused.checksum_words() if self.fused is not None else checksum_words(self.flat)

    @property
    def replayable(self) -> bool:
        """Whether :class:`fused_pack.Replay` can pack this bucket again (every tensor went through the kernel)."""
        return self.fused is not None and self.fused.replayable


@dataclass(frozen=True)
class _Recording:
    """A rank's last recorded pack: the export's addresses and static key, and its buckets' replay."""

    addresses: object
    key: object
    pack: fused_pack.Replay


_RECORDED: dict[tuple[str, int], _Recording] = {}  # (plan fingerprint, rank) -> the last recorded pack
_MAX_RECORDED = 64


def send_weights(plan: TransferPlan, rank: int, weights: Iterable[tuple[str, torch.Tensor]],
                 transport: SenderTransport | None, version: int, device: torch.device,
                 digests: bool = False) -> dict:
    """Send ``rank``'s buckets of ``plan``; tensors the plan gives to other ranks are skipped.

    The iterator is always exhausted (an exporter's collectives need every rank); a rank the plan gives no
    bucket may pass ``transport=None``.

    ``weights`` with a ``static_key`` that is not None promises the same tensors (names, addresses, shapes,
    strides, dtypes) as every earlier export with that key: the rank's last recorded pack is replayed when
    the key matches, and the iterator is not read (it runs no collectives: its tensors are local views).
    ``weights.addresses`` (where it has them) starts the replay before the key is built.

    Returns ``{"buckets": {index: checksum}, "tensors": {name: sha256}, "replayed": bool}`` (tensors only
    when ``digests``).
    Raises ValueError for a name the plan lacks or a planned tensor the iterator never yielded. On any error
    the transport is closed, so replicas waiting on this rank's buckets fail at once rather than after
    ``weight_transfer.timeout_s`` (the coordinator's retry connects afresh).
    """
    try:
        return _send(plan, rank, weights, transport, version, device, digests)
    except BaseException:
        if transport is not None:
            transport.close()
        raise


def _send(plan: TransferPlan, rank: int, weights: Iterable[tuple[str, torch.Tensor]],
          transport: SenderTransport | None, version: int, device: torch.device, digests: bool) -> dict:
    mine = plan.buckets_of(rank)
    if mine and transport is None:
        raise ValueError(f"rank {rank}: sends {len(mine)} buckets of plan {plan.fingerprint} but has no transport")
    recorded = None if digests else _RECORDED.get((plan.fingerprint, rank))
    if recorded is not None and _addresses(weights) == recorded.addresses:
        replayed = _replay(recorded, weights, transport, version, device)
        if replayed is not None:
            return replayed
    key = None if digests else getattr(weights, "static_key", None)
    recording: list | None = [] if key is not None and mine else None
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
            sums[done.bucket.index] = done.checksum_words()
            if recording is not None and done.replayable:
                recording.append((done.bucket, done.fused.replay_launch()))
            else:
                recording = None
            transport.send(version, done.bucket, done.flat)
            next_bucket = next(order, None)
    if next_bucket is not None:
        missing = sorted(n for b in open_.values() for n in b.slots) or [s.name for s in next_bucket.slots]
        raise ValueError(f"rank {rank}: the trainer never gave {missing[:5]} (plan {plan.fingerprint})")
    if transport is not None:
        transport.finish(version)
    if recording is not None:
        if len(_RECORDED) >= _MAX_RECORDED:
            _RECORDED.clear()
        _RECORDED[(plan.fingerprint, rank)] = _Recording(_addresses(weights), key, fused_pack.Replay(recording))
    return _report(mine, sums, tensors, replayed=False)


def _addresses(weights) -> object:
    """The export's cheap replay key: its ``addresses``, or its ``static_key`` where it has no addresses."""
    addresses = getattr(weights, "addresses", None)
    return addresses if addresses is not None else getattr(weights, "static_key", None)


def _replay(recorded: _Recording, weights, transport: SenderTransport, version: int, device: torch.device) -> dict | None:
    """Pack every bucket by the recorded launches and send them; None, with nothing sent, when the
    export's static key (built while the GPU packs) is not the recorded one."""
    buckets = recorded.pack.buckets
    flats = [transport.buffer(bucket, device) for bucket in buckets]
    sums = recorded.pack.run(flats)
    if getattr(weights, "static_key", None) != recorded.key:
        return None
    for bucket, flat in zip(buckets, flats):
        transport.send(version, bucket, flat)
    transport.finish(version)
    return _report(buckets, dict(zip((b.index for b in buckets), sums)), {}, replayed=True)


def _report(mine: list[Bucket], sums: dict[int, torch.Tensor], tensors: dict, replayed: bool) -> dict:
    nbytes = {b.index: b.nbytes for b in mine}
    return {"buckets": checksum_texts({index: (nbytes[index], words) for index, words in sums.items()}),
            "tensors": tensors, "replayed": replayed}
