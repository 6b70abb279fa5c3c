"""The fused copy-and-checksum kernel packs the same bytes and gives the same checksum as ``copy_`` into
each slot followed by ``checksum_words``, for every kind of source tensor it meets."""

from __future__ import annotations

import torch

from weight_transfer import fused_pack
from weight_transfer.buckets import assign_buckets, pack
from weight_transfer.checksum import checksum_words
from weight_transfer.plan import TensorSpec
from weight_transfer.sender import _OpenBucket


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
