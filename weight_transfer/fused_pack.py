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
row blocks saved the three copies per layer (export alone 1.3 ms instead of 4.1 ms). Entries are cut into
64 KiB tiles and the grid has one program per tile (see the kernel).

Whole 1024-word blocks of 16-byte aligned sources are read and written 16 bytes at a time; an
interleaved A/B on the cuda_ipc tensor-set handoff found that within run-to-run noise of the scalar
loads (1B 37-52% of a D2D copy against 37-46%, 7B 66-68% against 66-69%).

A group is launched once its tensors reach ``GROUP_BYTES``: the exporter's tensors stay alive until their
group is copied, so that bounds the extra memory a transfer holds. A replay (the same tensors again, see
:mod:`weight_transfer.sender`) holds no exported tensors and packs a whole bucket in one launch: on the
H200 the 1B set in 256 MiB groups took 0.99 ms, in one launch 0.94 ms; a :class:`Replay` launches all of
a sender's buckets as one CUDA graph. Tensors the kernel
cannot read as 64-bit words (strided inside their rows, not 8-byte aligned, or runs that are not a
multiple of 8 bytes) are copied into their slot by ``copy_`` first and then read from there (their
slot's tail up to the next word is alignment padding, zero).
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from weight_transfer.buckets import Bucket, Slot, slot_view, zero_padding
from weight_transfer.checksum import CHUNK_WORDS

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch come without triton; buckets there are packed by copy_
    triton = None

GROUP_BYTES = 256 << 20
TILE_WORDS = 1 << 13  # words one program copies (64 KiB): tensors are cut into tiles to fill the GPU
BLOCK = 1024  # words per loop iteration of a program
WARPS = 8  # H200, 1B and 7B tensor sets: 2**13-2**15-word tiles, 1024-4096-word blocks, 4-16 warps; this was as fast as any
_MAX_TABLES = 4096  # device-resident launch tables kept across versions (a few KiB each)
_TABLES: dict[tuple, tuple] = {}


def usable(flat: torch.Tensor) -> bool:
    """Whether ``flat`` (a bucket buffer) is packed by the fused kernel."""
    return triton is not None and flat.is_cuda


class FusedPack:
    """One CUDA bucket being filled: ``add`` each tensor, then ``checksum_words`` (same value as
    :func:`weight_transfer.checksum.checksum_words` of the packed buffer, still on the device)."""

    def __init__(self, flat: torch.Tensor):
        self.flat, self.words = flat, flat.view(torch.int64)
        self.sums = torch.zeros(2, dtype=torch.int64, device=flat.device)
        self.entries: list[tuple[int, int, int, int, int]] = []  # (address, first slot word, run, stride, runs)
        self.launched = 0  # entries[:launched] are copied
        self.alive: list[torch.Tensor] = []  # sources of the entries not yet copied
        self.pending_bytes = 0
        self.replayable = True  # False once a tensor was copied in by copy_ (a replay would have to keep it alive)

    def add(self, slot: Slot, tensor: torch.Tensor) -> None:
        """Queue ``tensor`` for ``slot`` as one entry: contiguous, or row blocks (contiguous blocks along
        dim 0, as a fused QKV's q, k and v come); anything else the kernel cannot read is copied in first."""
        entry = _entry(tensor, self.flat.device)
        if entry is None:
            slot_view(slot, self.flat, tensor.shape).copy_(tensor)
            self.replayable = False
            entry = (self.flat.data_ptr() + slot.offset, -(-slot.nbytes // 8), 0, 1)
        address, run, stride, runs = entry
        self.entries.append((address, slot.offset // 8, run, stride, runs))
        self.alive.append(tensor)
        self.pending_bytes += slot.nbytes
        if self.pending_bytes >= GROUP_BYTES:
            self._launch()

    def checksum_words(self) -> torch.Tensor:
        self._launch()
        return self.sums

    def replay_launch(self) -> tuple | None:
        """One launch that packs the whole bucket again, for :class:`Replay` (None: no bytes), where
        ``replayable``. It covers every entry in one grid: the groups bound the first pass's memory (the
        exported tensors it keeps alive), a replay keeps none."""
        if not self.replayable:
            raise ValueError("a bucket with tensors copied in by copy_ cannot be replayed")
        return _launch_of(self.entries, self.flat.device)

    def _launch(self) -> None:
        launch = _launch_of(self.entries[self.launched:], self.flat.device)
        if launch is not None:
            _run(launch, self.words, self.sums)
        self.launched, self.alive, self.pending_bytes = len(self.entries), [], 0


class Replay:
    """Packs a sender's recorded buckets again (the same tensors at the same addresses, with new values or
    not) by their :meth:`FusedPack.replay_launch`. Into the same buffers as the last time (a transport
    that keeps its buffers, as CUDA IPC does) it replays a CUDA graph of the whole pack, captured the
    first time the buffers repeat: zeroing the sums and every bucket's launch are one graph launch. Into
    other buffers it zeroes their padding (the kernel never writes it) and launches per bucket.

    On the H200, after the ~25 ms the trainer idles while the replicas load, every host step of a send
    took 2-3 times as long as back to back, so the host work before the GPU packs is what a 1B model's
    send can still shed: its launches and publish took 0.58-0.64 ms as a graph against 0.81-1.05 ms, the
    send 1.27-1.32 ms inside the trainer against 1.56-1.64 ms, and in the bench into vLLM the median row
    went from 48% of a D2D copy (8 rows) to 55% (20 rows, three runs)."""

    def __init__(self, recorded: list[tuple[Bucket, tuple | None]]):
        self.buckets = [bucket for bucket, _ in recorded]
        self.launches = [launch for _, launch in recorded]
        self._buffers: list[weakref.ref] = []  # the last run's buffers, not kept alive
        self._graph: torch.cuda.CUDAGraph | None = None
        self._sums: torch.Tensor | None = None  # the graph's

    def run(self, flats: list[torch.Tensor]) -> torch.Tensor:
        """Pack ``flats`` (one per recorded bucket) on the current stream; returns the buckets' checksum
        words ([buckets, 2], rows as :meth:`FusedPack.checksum_words`; a graph's next run overwrites them)."""
        if len(self._buffers) != len(flats) or any(ref() is not flat for ref, flat in zip(self._buffers, flats)):
            self._buffers, self._graph = [weakref.ref(flat) for flat in flats], None
            for bucket, flat in zip(self.buckets, flats):
                zero_padding(bucket, flat)
            sums = torch.empty(len(flats), 2, dtype=torch.int64, device=flats[0].device)
            self._launch_all(flats, sums)
            return sums
        if self._graph is None:
            self._sums = torch.empty(len(flats), 2, dtype=torch.int64, device=flats[0].device)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph, capture_error_mode="thread_local"):  # other threads may use CUDA
                self._launch_all(flats, self._sums)
        self._graph.replay()
        return self._sums

    def _launch_all(self, flats: list[torch.Tensor], sums: torch.Tensor) -> None:
        sums.zero_()
        for launch, flat, words in zip(self.launches, flats, sums):
            if launch is not None:
                _run(launch, flat.view(torch.int64), words)


def _run(launch: tuple, words: torch.Tensor, sums: torch.Tensor) -> None:
    table, tiles, count, aligned = launch
    _copy_and_sum[(tiles,)](table, count, words, sums, TILE=TILE_WORDS, BLOCK=BLOCK, CHUNK=CHUNK_WORDS,
                            ALIGNED=aligned, num_warps=WARPS)


def _launch_of(entries: list[tuple[int, int, int, int, int]], device: torch.device) -> tuple | None:
    """(device table, tiles, entries, aligned) of one launch over ``entries``; None when they hold no
    bytes. The table is the entries as [5, count] (source address, first slot word, words per run, words
    between runs, runs) followed by one (entry, tile of that entry) pair per program, so the grid is flat:
    every program copies a tile, none is idle. A trainer's exported tensors keep their addresses from one
    update to the next, so each table is the same every version: it is kept on the device, keyed by its
    own contents, and uploaded (from pinned memory, not waiting for the GPU) only the first time."""
    key = (device, tuple(entries))
    launch = _TABLES.get(key)
    if launch is None and entries:
        rows = np.array(entries, dtype=np.int64)
        address, run, stride, runs = rows[:, 0], rows[:, 2], rows[:, 3], rows[:, 4]
        tiles = runs * -(-run // TILE_WORDS)
        total = int(tiles.sum())
        if not total:
            return None
        owner = np.repeat(np.arange(len(entries)), tiles)
        within = np.arange(total) - np.repeat(np.cumsum(tiles) - tiles, tiles)
        host = torch.from_numpy(np.concatenate([rows.T.ravel(), owner, within])).pin_memory()
        aligned = bool(np.all((address % 16 == 0) & ((runs == 1) | ((run % 2 == 0) & (stride % 2 == 0)))))
        if len(_TABLES) >= _MAX_TABLES:  # another layout or model: drop the old ones
            _TABLES.clear()
        launch = _TABLES[key] = (host.to(device, non_blocking=True), total, len(entries), aligned)
    return launch


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
        """Program p copies tile ``within[p]`` (up to TILE words) of entry ``owner[p]`` of ``table`` ([5,
        count]: source address, first destination word, words per run, words from one run's start to the
        next, runs; then the programs' owner and within rows; a run's tiles are consecutive) BLOCK words at
        a time, and adds their plain and chunk-weighted sums (a word in chunk c of the bucket weighs c + 1)
        to ``sums`` atomically (64-bit adds wrap, as torch's do). Runs are contiguous in the bucket.

        Whole blocks are copied without a mask and the tail with one; with ``ALIGNED`` (every source and
        run 16-byte aligned; slots always are) the whole blocks are read and written 16 bytes at a time
        (``ld.global.v2.b64``), which Triton emits only for unmasked accesses it knows to be aligned.

        The per-program rows cost one dependent load more than a (tile, entry) grid, which left every entry
        with fewer tiles than the largest idle programs: on the H200 a 1B tensor set in one launch took
        0.94 ms against 1.14-1.60 ms (D2D copy 0.84 ms), a 7B set 6.69 ms against 7.28-9.57 ms (D2D 6.19).
        A flat grid that found its entry by binary search instead was slower than both."""
        program = tl.program_id(0)
        entry = tl.load(table + 5 * count + program)
        tile = tl.load(table + 5 * count + tl.num_programs(0) + program)
        source = tl.load(table + entry).to(tl.pointer_type(tl.int64))
        first = tl.load(table + count + entry)
        run = tl.load(table + 2 * count + entry)
        stride = tl.load(table + 3 * count + entry)
        per_run = tl.cdiv(run, TILE)
        index = tile // per_run  # which run this tile reads
        begin = (tile % per_run) * TILE
        end = tl.minimum(run, begin + TILE)
        source += index * stride
        first += index * run
        if ALIGNED:
            source = tl.multiple_of(source, 16)
            first = tl.multiple_of(first, 2)
        whole = begin + (end - begin) // BLOCK * BLOCK
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
