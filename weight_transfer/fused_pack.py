"""Pack tensors into a CUDA bucket and checksum them in the same pass: one Triton kernel per group of
tensors reads each source word once, writes it to its slot and adds it to the bucket's two sums.

Packing with one ``copy_`` per tensor and then reading the bucket again for :func:`checksum_words` costs a
launch per tensor (host-bound for the 8-23 MB tensors of a 1B model) plus a second pass over the bytes:
on the H200, 1.78 GB of 113 tensors took 1.2 ms to copy (a single D2D copy of the same bytes: 0.86 ms),
1.1 ms of host time to enqueue, and 0.49 ms to checksum. The kernel gives the same bytes and the same
two sums (the sums wrap modulo 2**64, so the order of addition does not matter).

A tensor is one kernel entry: contiguous, or row blocks (contiguous runs along dim 0, as the exporter
gives a fused QKV's q, k and v without copying them). On the H200 a 7B megatron model's export (355
tensors, 13.5 GB) was exported and packed in 7.8 ms against 6.8 ms for a D2D copy of the same bytes; the
row blocks saved the three copies per layer (export alone 1.3 ms instead of 4.1 ms). One entry per block
instead made a launch's grid (largest entry's tiles x entries) mostly idle programs: 14.6 ms for a
pre-exported list instead of 9.4 ms.

Whole 1024-word blocks of 16-byte aligned sources are read and written 16 bytes at a time; an
interleaved A/B on the cuda_ipc tensor-set handoff found that within run-to-run noise of the scalar
loads (1B 37-52% of a D2D copy against 37-46%, 7B 66-68% against 66-69%).

A group is launched once its tensors reach ``GROUP_BYTES`` (or ``_MAX_ENTRIES`` tensors): the exporter's
tensors stay alive until their group is copied, so that bounds the extra memory a transfer holds
(64 MiB groups ran slower, 10-11 ms for the 7B export, and 1 GiB groups no faster). Tensors the kernel
cannot read as 64-bit words (strided inside their rows, not 8-byte aligned, or runs that are not a
multiple of 8 bytes) are copied into their slot by ``copy_`` first and then read from there (their
slot's tail up to the next word is alignment padding, zero).
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
BLOCK = 1024  # words per loop iteration of a program
WARPS = 8  # H200, 1B and 7B tensor sets: 2**13-2**15-word tiles, 1024-4096-word blocks, 4-16 warps; this was as fast as any
_MAX_ENTRIES = 4096  # tensors per launch (the grid's second dimension)
_MAX_TABLES = 4096  # device-resident group tables kept across versions (a few KiB each)
_TABLES: dict[tuple, torch.Tensor] = {}


def usable(flat: torch.Tensor) -> bool:
    """Whether ``flat`` (a bucket buffer) is packed by the fused kernel."""
    return triton is not None and flat.is_cuda


class FusedPack:
    """One CUDA bucket being filled: ``add`` each tensor, then ``checksum_words`` (same value as
    :func:`weight_transfer.checksum.checksum_words` of the packed buffer, still on the device)."""

    def __init__(self, flat: torch.Tensor):
        self.flat, self.words = flat, flat.view(torch.int64)
        self.sums = torch.zeros(2, dtype=torch.int64, device=flat.device)
        self.pending: list[tuple[int, int, int, int, int]] = []  # (address, first slot word, run, stride, runs)
        self.alive: list[torch.Tensor] = []  # sources of pending entries, kept until their group is copied
        self.pending_bytes = self.tiles = 0  # the launch's grid: (most tiles of any pending entry, entries)
        self.aligned = True  # every pending source and run 16-byte aligned
        self.launches: list[tuple] | None = []  # what :func:`replay` needs; None once a tensor was copied in by copy_

    def add(self, slot: Slot, tensor: torch.Tensor) -> None:
        """Queue ``tensor`` for ``slot`` as one entry: contiguous, or row blocks (contiguous blocks along
        dim 0, as a fused QKV's q, k and v come); anything else the kernel cannot read is copied in first."""
        entry = _entry(tensor, self.flat.device)
        if entry is None:
            slot_view(slot, self.flat, tensor.shape).copy_(tensor)
            self.launches = None  # a replay would have to keep ``tensor`` alive to copy it again
            entry = (self.flat.data_ptr() + slot.offset, -(-slot.nbytes // 8), 0, 1)
        address, run, stride, runs = entry
        self.pending.append((address, slot.offset // 8, run, stride, runs))
        self.alive.append(tensor)
        self.pending_bytes += slot.nbytes
        # plain integer division: triton.cdiv is a JIT function (~6 us a call from the host, 1B profile on the H200)
        self.tiles = max(self.tiles, runs * -(-run // TILE_WORDS))
        self.aligned = self.aligned and address % 16 == 0 and (runs == 1 or (run % 2 == 0 and stride % 2 == 0))
        if self.pending_bytes >= GROUP_BYTES or len(self.pending) >= _MAX_ENTRIES:
            self._launch()

    def checksum_words(self) -> torch.Tensor:
        self._launch()
        return self.sums

    def _launch(self) -> None:
        if not self.pending:
            return
        count = len(self.pending)
        if self.tiles:
            launch = (_device_table(self.pending, self.flat.device), self.tiles, count, self.aligned)
            _run(launch, self.words, self.sums)
            if self.launches is not None:
                self.launches.append(launch)
        self.pending, self.alive, self.pending_bytes, self.tiles, self.aligned = [], [], 0, 0, True


def replay(flat: torch.Tensor, launches: list[tuple]) -> torch.Tensor:
    """Pack ``flat`` again by the ``launches`` a :class:`FusedPack` made (its tables name the source
    addresses, so the sources must be the same tensors at the same addresses, with new values or not);
    returns the checksum words, as :meth:`FusedPack.checksum_words` does. No host work per tensor."""
    sums = torch.zeros(2, dtype=torch.int64, device=flat.device)
    words = flat.view(torch.int64)
    for launch in launches:
        _run(launch, words, sums)
    return sums


def _run(launch: tuple, words: torch.Tensor, sums: torch.Tensor) -> None:
    table, tiles, count, aligned = launch
    _copy_and_sum[(tiles, count)](table, count, words, sums, TILE=TILE_WORDS, BLOCK=BLOCK, CHUNK=CHUNK_WORDS,
                                  ALIGNED=aligned, num_warps=WARPS)


def _device_table(pending: list[tuple[int, int, int, int, int]], device: torch.device) -> torch.Tensor:
    """``pending`` as the kernel's [5, count] table on ``device``. A trainer's exported tensors keep their
    addresses from one update to the next, so each group's table is the same every version: it is kept on
    the device, keyed by its own contents, and uploaded (from pinned memory, not waiting for the GPU) only
    the first time."""
    key = (device, tuple(pending))
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) >= _MAX_TABLES:  # another layout or model: drop the old ones
            _TABLES.clear()
        host = torch.tensor(list(zip(*pending)), dtype=torch.int64).pin_memory()
        table = _TABLES[key] = host.to(device, non_blocking=True)
    return table


def _entry(tensor: torch.Tensor, device: torch.device) -> tuple[int, int, int, int] | None:
    """``tensor`` as (address, words per run, words between runs, runs): its bytes in row-major order are
    ``runs`` contiguous runs of whole 64-bit words. None where the kernel cannot read it so: another
    device, a stride inside the rows, or an address or run length that is not a whole number of words."""
    if tensor.device != device or tensor.data_ptr() % 8:
        return None
    size = tensor.element_size()
    if tensor.is_contiguous():
        nbytes = tensor.numel() * size
        return (tensor.data_ptr(), nbytes // 8, 0, 1) if nbytes % 8 == 0 else None
    if tensor.dim() < 2 or not tensor[0].is_contiguous():
        return None
    run, step = tensor[0].numel() * size, tensor.stride(0) * size
    if run % 8 or step % 8:
        return None
    return tensor.data_ptr(), run // 8, step // 8, tensor.shape[0]


if triton is not None:

    @triton.jit(do_not_specialize=["count"])
    def _copy_and_sum(table, count, words, sums, TILE: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                      ALIGNED: tl.constexpr):
        """Program (tile, entry) copies one tile (up to TILE words) of entry ``entry`` of ``table`` ([5,
        count]: source address, first destination word, words per run, words from one run's start to the
        next, runs; a run's tiles are consecutive and tiles past an entry's end do nothing) BLOCK words at a
        time, and adds their plain and chunk-weighted sums (a word in chunk c of the bucket weighs c + 1) to
        ``sums`` atomically (64-bit adds wrap, as torch's do). Runs are contiguous in the bucket.

        Whole blocks are copied without a mask and the tail with one; with ``ALIGNED`` (every source and
        run 16-byte aligned; slots always are) the whole blocks are read and written 16 bytes at a time
        (``ld.global.v2.b64``), which Triton emits only for unmasked accesses it knows to be aligned.

        A flat grid that finds its entry by binary search measured slower on the 1B set (36-41% of a
        D2D copy against 41-52%): the search's dependent loads cost about what a tile's copy does."""
        tile = tl.program_id(0).to(tl.int64)
        entry = tl.program_id(1)
        source = tl.load(table + entry).to(tl.pointer_type(tl.int64))
        first = tl.load(table + count + entry)
        run = tl.load(table + 2 * count + entry)
        stride = tl.load(table + 3 * count + entry)
        runs = tl.load(table + 4 * count + entry)
        per_run = tl.maximum(tl.cdiv(run, TILE), 1)
        index = tile // per_run  # which run this tile reads
        begin = (tile % per_run) * TILE
        end = tl.where(index < runs, tl.minimum(run, begin + TILE), begin)
        source += index * stride
        first += index * run
        if ALIGNED:
            source = tl.multiple_of(source, 16)
            first = tl.multiple_of(first, 2)
        whole = begin + tl.maximum(end - begin, 0) // BLOCK * BLOCK
        plain = tl.zeros([BLOCK], dtype=tl.int64)
        weighted = tl.zeros([BLOCK], dtype=tl.int64)
        for start in range(begin, whole, BLOCK):
            offsets = tl.multiple_of(start, BLOCK) + tl.arange(0, BLOCK)
            values = tl.load(source + offsets)
            at = first + offsets
            tl.store(words + at, values)
            plain += values
            weighted += values * (at // CHUNK + 1)
        if whole < end:
            offsets = whole + tl.arange(0, BLOCK)
            mask = offsets < end
            values = tl.load(source + offsets, mask=mask, other=0)
            at = first + offsets
            tl.store(words + at, values, mask=mask)
            plain += values
            weighted += values * (at // CHUNK + 1)
        tl.atomic_add(sums, tl.sum(plain, axis=0))
        tl.atomic_add(sums + 1, tl.sum(weighted, axis=0))
