"""The fused copy-and-checksum kernel packs the same bytes and gives the same checksum as ``copy_`` into
each slot followed by ``checksum_words``, for every kind of source tensor it meets, and so does the replay
of a recorded pack."""

from __future__ import annotations

import torch

from weight_transfer import fused_pack, sender
from weight_transfer.buckets import assign_buckets, pack
from weight_transfer.checksum import bucket_checksum, checksum_words
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TensorSpec, TransferPlan
from weight_transfer.sender import _OpenBucket
from weight_transfer.transports.base import SenderTransport


class _Entry:
    def __init__(self, spec: TensorSpec):
        self.spec, self.sender = spec, 0


def _sources(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Word-readable tensors, row blocks of a fused QKV (one kernel entry per block), and ones the kernel
    must route through copy_: odd byte sizes, strided, offset by 2 or 8 bytes, on the CPU."""
    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    base = rand(4097 * 3)
    fused = rand(8, 12, 256)  # 8 KV groups of 8 q, 2 k and 2 v rows
    narrow = rand(4, 8, 3)  # rows of 3 bf16: blocks of 2 rows are 12-byte runs, not whole words
    return {
        "blocks_q": fused[:, :8],
        "blocks_k": fused[:, 8:10],
        "blocks_narrow": narrow[:, 4:6],
        "big": rand(3000, 1024),  # several programs and several 4096-word checksum chunks
        "f32": rand(777, 33, dtype=torch.float32),
        "odd_bytes": rand(3, 5),  # 30 bytes
        "one": rand(1),
        "strided": rand(64, 128).t(),
        "misaligned": base[1:4097],  # 2 bytes past a word boundary
        "word_aligned": base[4:4100],  # 8 bytes past a 16-byte boundary: read directly
        "empty": rand(0, 8),
        "int8": torch.randint(-128, 127, (1001,), generator=gen, device="cuda", dtype=torch.int8),
        "on_cpu": torch.randn(96, 40, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16),
        "last": rand(5000, 7),
    }


def _specs(tensors):
    """The plan's (HF) shapes: row blocks ``[blocks, rows, ...]`` are the tensor ``[blocks * rows, ...]``."""
    return [TensorSpec(n, tuple(t.flatten(0, 1).shape if n.startswith("blocks") else t.shape),
                       str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()]


def test_fused_pack_matches_copy_then_checksum(monkeypatch):
    assert fused_pack.usable(torch.empty(8, dtype=torch.uint8, device="cuda")), "triton should import with CUDA torch"
    gen = torch.Generator(device="cuda").manual_seed(0)
    tensors = _sources(gen)
    for group_bytes in (1 << 30, 1 << 20, 1):  # one launch per bucket, a few, one per tensor
        monkeypatch.setattr(fused_pack, "GROUP_BYTES", group_bytes)
        for bucket in assign_buckets([_Entry(s) for s in _specs(tensors)], 4 << 20):
            want = pack(bucket, {s.name: tensors[s.name].cuda() for s in bucket.slots},
                        torch.empty(bucket.nbytes, dtype=torch.uint8, device="cuda"))
            flat = torch.full((bucket.nbytes,), 0xAB, dtype=torch.uint8, device="cuda")  # stale bytes from a last version
            filling = _OpenBucket(bucket, flat)
            assert filling.fused is not None
            for slot in bucket.slots:
                filling.add(slot.name, tensors[slot.name])
            got = filling.checksum_words()
            assert torch.equal(flat, want), f"bucket {bucket.index}: packed bytes differ (group {group_bytes})"
            assert torch.equal(got, checksum_words(want)), f"bucket {bucket.index}: checksum differs (group {group_bytes})"


def test_fused_pack_sums_wrap_like_torch():
    """Words near 2**63 overflow the sums: both sides wrap modulo 2**64 the same way."""
    words = torch.full((3 * 4096 + 5,), 2**63 - 3, dtype=torch.int64, device="cuda")
    words[::7] = -(2**63)
    specs = [TensorSpec("w", tuple(words.shape), "int64")]
    bucket = assign_buckets([_Entry(s) for s in specs], 1 << 20)[0]
    flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device="cuda")
    filling = _OpenBucket(bucket, flat)
    filling.add("w", words)
    assert torch.equal(filling.checksum_words(), checksum_words(flat))


def test_group_tables_stay_on_the_device_across_versions(monkeypatch):
    """The second version of the same tensors (same addresses, new values) reuses every group's table and
    still packs the new values."""
    monkeypatch.setattr(fused_pack, "GROUP_BYTES", 1 << 20)
    gen = torch.Generator(device="cuda").manual_seed(2)
    tensors = {n: t for n, t in _sources(gen).items() if t.is_cuda}
    buckets = assign_buckets([_Entry(s) for s in _specs(tensors)], 4 << 20)
    flats = {b.index: torch.empty(b.nbytes, dtype=torch.uint8, device="cuda") for b in buckets}
    for version in range(2):
        tables = len(fused_pack._TABLES)
        for bucket in buckets:
            filling = _OpenBucket(bucket, flats[bucket.index])
            for slot in bucket.slots:
                filling.add(slot.name, tensors[slot.name])
            got = filling.checksum_words()
            want = pack(bucket, tensors, torch.empty(bucket.nbytes, dtype=torch.uint8, device="cuda"))
            assert torch.equal(flats[bucket.index], want) and torch.equal(got, checksum_words(want)), f"version {version}"
        if version:
            assert len(fused_pack._TABLES) == tables, "the same tensors must reuse their group tables"
        for t in tensors.values():  # an optimizer step: new values in place
            t.add_(1)


class _Buffers(SenderTransport):
    """A sender transport that keeps each bucket's buffer, as CUDA IPC does, and sends nowhere."""

    def __init__(self):
        self.flats = {}

    def buffer(self, bucket, device):
        if bucket.index not in self.flats or self.flats[bucket.index].numel() != bucket.nbytes:
            self.flats[bucket.index] = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
        return self.flats[bucket.index]

    def send(self, version, bucket, flat):
        pass


class _Export:
    """An export of fixed tensors with a static key (and addresses, where given); counts how often it is read."""

    def __init__(self, tensors: dict, static_key, addresses=None):
        self.tensors, self.static_key, self.reads = tensors, static_key, 0
        if addresses is not None:
            self.addresses = addresses

    def __iter__(self):
        self.reads += 1
        return iter(self.tensors.items())


def test_a_static_export_is_packed_by_replaying_its_first_send(monkeypatch):
    """Same key: the recorded launches pack the new values without reading the export, as a CUDA graph once
    the transport's buffers repeat (new buffers: launched per bucket, their padding zeroed, then a new
    graph); a new key (the parameters moved, or other tensors under the same addresses) records again; an
    export with a tensor only copy_ can read is never replayed."""
    monkeypatch.setattr(sender, "_RECORDED", {})
    monkeypatch.setattr(fused_pack, "GROUP_BYTES", 1 << 20)
    gen = torch.Generator(device="cuda").manual_seed(3)
    readable = ("blocks_q", "blocks_k", "big", "word_aligned", "empty", "last")  # whole 64-bit words: no copy_
    tensors = {n: t for n, t in _sources(gen).items() if n in readable}
    plan = TransferPlan.build(_specs(tensors), TrainerLayout(num_layers=1), 4 << 20)
    assert len(plan.buckets) > 1
    transport, device = _Buffers(), torch.device("cuda")

    def send(export, version):
        out = sender.send_weights(plan, 0, export, transport, version, device)
        for bucket in plan.buckets:
            want = pack(bucket, export.tensors, torch.empty(bucket.nbytes, dtype=torch.uint8, device="cuda"))
            assert torch.equal(transport.flats[bucket.index], want), f"version {version} bucket {bucket.index}"
            assert out["buckets"][bucket.index] == bucket_checksum(want), f"version {version} bucket {bucket.index}"

    for version in range(6):
        if version == 4:  # the transport allocates anew, with garbage where the padding is
            transport.flats = {i: torch.full_like(f, 255) for i, f in transport.flats.items()}
        export = _Export(tensors, ("params", 1))
        send(export, version)
        assert export.reads == (1 if version == 0 else 0), f"version {version}: read {export.reads} times"
        (recording,) = sender._RECORDED.values()
        graphed = recording.pack._graph is not None
        assert graphed == (version in (2, 3, 5)), f"version {version}: replayed as a graph {graphed}"
        for t in tensors.values():  # an optimizer step: new values in place
            t.add_(1)
    relaid = _Export({n: t.clone() for n, t in tensors.items()}, ("params", "relaid"), addresses=("params", 1))
    send(relaid, 6)  # the replay starts on the same addresses, the key then says the tensors are others
    assert relaid.reads == 1, "a new key under the same addresses must be packed from the export"
    moved = _Export({n: t.clone() for n, t in tensors.items()}, ("params", 2))
    send(moved, 7)
    assert moved.reads == 1, "a new key must be packed from the export and recorded again"
    strided = {**tensors, "strided": torch.randn(64, 128, generator=gen, device="cuda").to(torch.bfloat16).t()}
    plan = TransferPlan.build(_specs(strided), TrainerLayout(num_layers=1), 4 << 20)
    for version in (8, 9):
        export = _Export(strided, ("params", 3))
        send(export, version)
        assert export.reads == 1, "a tensor packed by copy_ cannot be replayed (it would be kept alive)"
