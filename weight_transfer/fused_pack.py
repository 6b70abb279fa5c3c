"""Pack tensors into a CUDA bucket and checksum them in the same pass: one Triton kernel per group of
tensors reads each source word once, writes it to its slot and adds it to the bucket's two sums.

Packing with one ``copy_`` per tensor and then reading the bucket again for :func:`checksum_words` costs a
launch per tensor (host-bound for the 8-23 MB tensors of a 1B model) plus a second pass over the bytes:
on the H200, 1.78 GB of 113 tensors took 1.2 ms to copy (a single D2D copy of the same bytes: 0.86 ms),
1.1 ms of host time to enqueue, and 0.49 ms to checksum. The kernel gives the same bytes and the same
two sums (the sums wrap modulo 2**64, so the order of addition does not matter).

On the H200 the kernel packed and checksummed that 1B set in 1.2 ms and a 7B set (13.2 GB, 225 tensors) in
8.0 ms, against 10.4 ms for ``copy_`` and ``checksum_words``. (Alignment hints, ``tl.multiple_of`` on the
addresses, did not make Triton 3.6 emit vector loads, and cuda_ipc handoffs of the 7B set ran at 64-71%
of a D2D copy with them against 76-80% without.)

A group is launched once its tensors reach ``GROUP_BYTES`` (or ``_MAX_ENTRIES`` tensors): the exporter's
tensors stay alive until their group is copied, so that bounds the extra memory a transfer holds. Tensors
the kernel cannot read as 64-bit words (non-contiguous, not 8-byte aligned, or a size that is not a
multiple of 8 bytes) are copied into their slot by ``copy_`` first and then read from there (their slot's
tail up to the next word is alignment padding, zero).
"""

from __future__ import annotations

import torch

from weight_transfer.buckets import Slot, slot_view
from weight_transfer.checksum import CHUNK_WORDS

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch come without triton; buckets there are packed by copy_
    triton = None

GROUP_BYTES = 256 << 20
TILE_WORDS = 1 << 14  # words one program copies (128 KiB): tensors are cut into tiles to fill the GPU
_BLOCK = 1024  # words per loop iteration of a program
_WARPS = 8  # H200, 1B and 7B tensor sets: tiles of 2**14 words, 1024-word blocks and 8 warps ran fastest
_MAX_ENTRIES = 4096  # tensors per launch (the grid's second dimension)


def usable(flat: torch.Tensor) -> bool:
    """Whether ``flat`` (a bucket buffer) is packed by the fused kernel."""
    return triton is not None and flat.is_cuda


class FusedPack:
    """One CUDA bucket being filled: ``add`` each tensor, then ``checksum_words`` (same value as
    :func:`weight_transfer.checksum.checksum_words` of the packed buffer, still on the device)."""

    def __init__(self, flat: torch.Tensor):
        self.flat, self.words = flat, flat.view(torch.int64)
        self.sums = torch.zeros(2, dtype=torch.int64, device=flat.device)
        self.pending: list[tuple[int, int, int]] = []  # (source address, first slot word, words)
        self.alive: list[torch.Tensor] = []  # sources of pending entries, kept until their group is copied
        self.pending_bytes = 0

    def add(self, slot: Slot, tensor: torch.Tensor) -> None:
        if (tensor.device == self.flat.device and tensor.is_contiguous() and tensor.data_ptr() % 8 == 0
                and slot.nbytes % 8 == 0):
            self.pending.append((tensor.data_ptr(), slot.offset // 8, slot.nbytes // 8))
            self.alive.append(tensor)
        else:
            slot_view(slot, self.flat).copy_(tensor)
            self.pending.append((self.flat.data_ptr() + slot.offset, slot.offset // 8, -(-slot.nbytes // 8)))
        self.pending_bytes += slot.nbytes
        if self.pending_bytes >= GROUP_BYTES or len(self.pending) >= _MAX_ENTRIES:
            self._launch()

    def checksum_words(self) -> torch.Tensor:
        self._launch()
        return self.sums

    def _launch(self) -> None:
        if not self.pending:
            return
        count = len(self.pending)
        tiles = triton.cdiv(max(n for _, _, n in self.pending), TILE_WORDS)
        if tiles:
            table = torch.tensor(list(zip(*self.pending)), dtype=torch.int64).to(self.flat.device, non_blocking=True)
            _copy_and_sum[(tiles, count)](table, count, self.words, self.sums, TILE=TILE_WORDS, BLOCK=_BLOCK,
                                          CHUNK=CHUNK_WORDS, num_warps=_WARPS)
        self.pending, self.alive, self.pending_bytes = [], [], 0


if triton is not None:

    @triton.jit
    def _copy_and_sum(table, count, words, sums, TILE: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
        """Program (tile, entry) copies words [tile*TILE, +TILE) of entry ``entry`` of ``table``
        ([3, count]: source address, first destination word, word count; tiles past an entry's end do
        nothing) BLOCK words at a time, and adds their plain and chunk-weighted sums (a word in chunk c
        of the bucket weighs c + 1) to ``sums`` atomically (64-bit adds wrap, as torch's do).

        A flat grid that finds its entry by binary search measured slower on the 1B set (36-41% of a
        D2D copy against 41-52%): the search's dependent loads cost about what a tile's copy does."""
        tile = tl.program_id(0).to(tl.int64)
        entry = tl.program_id(1)
        source = tl.load(table + entry).to(tl.pointer_type(tl.int64))
        first = tl.load(table + count + entry)
        end = tl.minimum(tl.load(table + 2 * count + entry), (tile + 1) * TILE)
        plain = tl.zeros([BLOCK], dtype=tl.int64)
        weighted = tl.zeros([BLOCK], dtype=tl.int64)
        for start in range(tile * TILE, end, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            mask = offsets < end
            values = tl.load(source + offsets, mask=mask, other=0)
            index = first + offsets
            tl.store(words + index, values, mask=mask)
            plain += values
            weighted += values * (index // CHUNK + 1)
        tl.atomic_add(sums, tl.sum(plain, axis=0))
        tl.atomic_add(sums + 1, tl.sum(weighted, axis=0))
