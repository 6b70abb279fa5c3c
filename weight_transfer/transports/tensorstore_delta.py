"""Deltas on a shared filesystem, written and read with tensorstore: for fleets whose trainer and inference
nodes share only a folder (NFS, Lustre, a fuse mount of an object store).

Layout under ``root``, per plan and sender rank::

    <root>/<plan fingerprint>/r<rank>/v<version>/b<bucket>/   zarr v3 array, uint8 [bucket bytes]
    <root>/<plan fingerprint>/r<rank>/v<version>/manifest.json

A bucket of version v is stored either as a *delta* (its bytes XOR version ``base``'s, normally v-1) or
*full* (XOR nothing). Arrays are chunked (``chunk_kb``) and compressed losslessly (blosc: byte shuffle at
the bucket's element size, then zstd); a chunk whose stored bytes would be all zero is not written (the
array's fill value is 0), so an unchanged chunk costs nothing on disk or on the wire. XOR of the bit
patterns keeps the unchanged elements of a changed chunk at zero, and the shuffle puts their zero bytes
together for zstd (bf16 training changes ~1-2% of elements per step).

The manifest is written last (temporary file, then rename), so a reader never sees a half-written
version; it names the session that wrote it, each bucket's base version, its checksum (of the whole
bucket after applying the delta: the coordinator's expected checksum), the chunks that were written and
their bytes on disk. A receiver waits for the manifest of its session, reads only the listed chunks,
checks they exist (a missing chunk would read back as zeros), rebuilds the bucket from the version it
holds and verifies the checksum: a missing or corrupted chunk fails the receive, and the replica keeps
its weights.

A receiver keeps the last verified bytes of each bucket (one copy of the model in host memory per worker;
kept across sessions in the process, see ``_HELD``) as the base for the next delta. One that lacks the
base (a fresh or restarted replica) rebuilds the chain from the sender's last full version: a sender
writes full every ``full_every`` versions, when it has no base (a fresh process), and when it sends a
version again (a retry: what is on disk may be what failed). After each manifest the sender deletes its
versions older than its last full one (and newer than the current: a previous run's).

Receivers fetch in their receive call, beside the send and before the pause: the pause window holds only
the verify and the load.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from weight_transfer.buckets import Bucket
from weight_transfer.checksum import bucket_checksum
from weight_transfer.plan import element_size
from weight_transfer.transports.base import ReceiverTransport, SenderTransport, TransportError

_FIRST_PAUSE_S, _LAST_PAUSE_S = 1e-3, 50e-3


def _ts():
    import tensorstore  # imported on first use: the other transports do not need it

    return tensorstore


def rank_dir(session: dict, rank: int) -> Path:
    return Path(session["root"]) / session["plan"] / f"r{rank}"


def version_dir(session: dict, rank: int, version: int) -> Path:
    return rank_dir(session, rank) / f"v{version}"


def manifest_path(session: dict, rank: int, version: int) -> Path:
    return version_dir(session, rank, version) / "manifest.json"


def chunk_file(array: Path, chunk: int) -> Path:
    """Where zarr v3's default key encoding puts chunk ``chunk`` of a 1-D array."""
    return array / "c" / str(chunk)


def _spec(path: Path, nbytes: int, chunk_bytes: int, typesize: int) -> dict:
    codecs = [{"name": "bytes"}, {"name": "blosc", "configuration": {
        "cname": "zstd", "clevel": 1, "shuffle": "shuffle", "typesize": typesize, "blocksize": 0}}]
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {"shape": [nbytes], "data_type": "uint8", "fill_value": 0, "codecs": codecs,
                         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk_bytes]}}}}


def _chunk_range(chunk: int, chunk_bytes: int, nbytes: int) -> tuple[int, int]:
    return chunk * chunk_bytes, min((chunk + 1) * chunk_bytes, nbytes)


def nonzero_chunks(flat: torch.Tensor, chunk_bytes: int) -> list[int]:
    """Indices of the ``chunk_bytes`` chunks of ``flat`` (uint8, length a multiple of 8) with a nonzero byte."""
    words = flat.view(torch.int64)
    per = chunk_bytes // 8
    full = words.numel() // per
    flags = words[:full * per].view(full, per).ne(0).any(1).nonzero().flatten().tolist()
    if words.numel() > full * per and bool(words[full * per:].ne(0).any()):
        flags.append(full)
    return flags


def _mostly(chunks: list[int], nbytes: int, chunk_bytes: int) -> bool:
    """Whether ``chunks`` are most of an array's: then it is written or read in one call (tensorstore
    parallelises it), instead of one call per chunk."""
    return 2 * len(chunks) > -(-nbytes // chunk_bytes)


def _xor_(out: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    out.view(torch.int64).bitwise_xor_(other.view(torch.int64))
    return out


@dataclass
class _RankState:
    """What a sender process keeps between versions (and sessions): the bytes of its last written version."""

    version: int | None = None
    last_full: int | None = None
    bases: dict[int, torch.Tensor] = field(default_factory=dict)
    spares: dict[int, torch.Tensor] = field(default_factory=dict)


_STATES: dict[tuple[str, str, int], _RankState] = {}
"""(root, plan fingerprint, rank) -> the sender's state; lives in the process so a new session (a retry,
a reconnect) still writes deltas against what the process wrote last."""

_HELD: dict[tuple[str, str, int], tuple[int, torch.Tensor]] = {}
"""(root, plan fingerprint, bucket index) -> (version, verified bytes) a receiver process holds."""


class TensorstoreDeltaSender(SenderTransport):
    def __init__(self, session: dict, rank: int, device: torch.device):
        if not session.get("root"):
            raise ValueError("weight_transfer.transport.root: set a folder every trainer and inference node mounts")
        self.session, self.rank = session, rank
        self.chunk_bytes = session["chunk_kb"] << 10
        key = (session["root"], session["plan"], rank)
        self.state = _STATES.setdefault(key, _RankState())
        self.writing: int | None = None
        self.full = False
        self.pending: list = []
        self.entries: dict[str, dict] = {}

    def buffer(self, bucket: Bucket, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":  # packed on the device, copied to host memory in send
            return torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
        spare = self.state.spares.pop(bucket.index, None)
        if spare is None or spare.numel() != bucket.nbytes:
            spare = torch.empty(bucket.nbytes, dtype=torch.uint8)
        return spare

    def _start(self, version: int) -> None:
        state = self.state
        self.writing, self.pending, self.entries = version, [], {}
        base_ok = (state.version is not None and state.version < version
                   and manifest_path(self.session, self.rank, state.version).exists())
        self.full = not base_ok or version - state.last_full >= self.session["full_every"]
        target = version_dir(self.session, self.rank, version)
        (target / "manifest.json").unlink(missing_ok=True)  # first: readers must never see the old manifest
        shutil.rmtree(target, ignore_errors=True)

    def send(self, version: int, bucket: Bucket, flat: torch.Tensor) -> None:
        if flat.device.type != "cpu":
            flat = flat.cpu()
        if self.writing != version:
            self._start(version)
        base = self.state.bases.pop(bucket.index, None)
        if base is not None and base.numel() != bucket.nbytes:
            base = None
        delta_of = None if self.full or base is None else self.state.version
        stored = flat if delta_of is None else _xor_(base, flat)  # the old base buffer now holds the delta
        chunks = nonzero_chunks(stored, self.chunk_bytes)
        path = version_dir(self.session, self.rank, version) / f"b{bucket.index}"
        typesize = max(element_size(s.dtype) for s in bucket.slots)
        try:
            array = _ts().open(_spec(path, bucket.nbytes, self.chunk_bytes, typesize), create=True,
                               delete_existing=True).result()
            data = stored.numpy()
            if _mostly(chunks, bucket.nbytes, self.chunk_bytes):  # one call: tensorstore skips the zero chunks itself
                self.pending.append(array.write(data))
            else:
                for chunk in chunks:
                    lo, hi = _chunk_range(chunk, self.chunk_bytes, bucket.nbytes)
                    self.pending.append(array[lo:hi].write(data[lo:hi]))
        except Exception as err:
            raise TransportError(f"tensorstore_delta: writing bucket {bucket.index} of version {version} at {path}: {err}") from err
        self.entries[str(bucket.index)] = {"base": delta_of, "checksum": bucket_checksum(flat), "chunks": chunks,
                                           "nbytes": bucket.nbytes, "chunk_bytes": self.chunk_bytes}
        self.state.bases[bucket.index] = flat
        if base is not None:
            self.state.spares[bucket.index] = base

    def finish(self, version: int) -> None:
        if self.writing != version:
            return
        try:
            for future in self.pending:
                future.result()
        except Exception as err:
            raise TransportError(f"tensorstore_delta: writing version {version} of rank {self.rank}: {err}") from err
        self.pending = []
        vdir = version_dir(self.session, self.rank, version)
        for index, entry in self.entries.items():
            entry["stored_bytes"] = sum(chunk_file(vdir / f"b{index}", c).stat().st_size for c in entry["chunks"])
        manifest = {"version": version, "rank": self.rank, "session": self.session["id"], "plan": self.session["plan"],
                    "full": self.full, "buckets": self.entries}
        tmp = vdir / "manifest.json.tmp"
        tmp.write_text(json.dumps(manifest))
        os.replace(tmp, vdir / "manifest.json")
        self.state.version = version
        if self.full:
            self.state.last_full = version
        self.writing = None
        self._collect(version)

    def _collect(self, version: int) -> None:
        """Delete this rank's versions no reader needs: older than the last full one, or newer than ``version``."""
        for child in rank_dir(self.session, self.rank).glob("v*"):
            try:
                other = int(child.name[1:])
            except ValueError:
                continue
            if other < self.state.last_full or other > version:
                shutil.rmtree(child, ignore_errors=True)

    def close(self) -> None:
        self.pending, self.entries, self.writing = [], {}, None


class TensorstoreDeltaReceiver(ReceiverTransport):
    def __init__(self, session: dict, rank: int, device: torch.device):
        if not session.get("root"):
            raise ValueError("weight_transfer.transport.root: set a folder every trainer and inference node mounts")
        self.session, self.device = session, device
        self.manifests: dict[tuple[int, int], dict] = {}
        self.stats = {"bytes_read": 0, "chunks_read": 0, "fetch_seconds": 0.0}
        """What the last ``receive`` read: compressed chunk bytes, chunks, seconds."""

    def receive(self, version: int, buckets: Sequence[Bucket]) -> Iterator[tuple[Bucket, torch.Tensor]]:
        self.stats = {"bytes_read": 0, "chunks_read": 0, "fetch_seconds": 0.0}
        self.manifests = {}
        for rank in sorted({b.sender for b in buckets}):
            self._wait_for(rank, version)
        for bucket in buckets:
            start = time.perf_counter()
            flat = self._resolve(bucket, version)
            self.stats["fetch_seconds"] += time.perf_counter() - start
            yield bucket, flat if self.device.type == "cpu" else flat.to(self.device)

    def _wait_for(self, rank: int, version: int) -> None:
        path = manifest_path(self.session, rank, version)
        deadline = time.monotonic() + self.session["timeout_s"]
        pause = _FIRST_PAUSE_S
        while True:
            manifest = _read_json(path)
            if manifest is not None and manifest["session"] == self.session["id"]:
                self.manifests[(rank, version)] = manifest
                return
            if time.monotonic() > deadline:
                raise TransportError(f"tensorstore_delta: version {version} of sender {rank} was not published at "
                                     f"{path} within {self.session['timeout_s']} s")
            time.sleep(pause)
            pause = min(2 * pause, _LAST_PAUSE_S)

    def _manifest(self, rank: int, version: int) -> dict:
        """A committed manifest of an older version (any session): the chain to a full version."""
        if (rank, version) not in self.manifests:
            manifest = _read_json(manifest_path(self.session, rank, version))
            if manifest is None:
                raise TransportError(f"tensorstore_delta: version {version} of sender {rank} is gone (collected?) "
                                     "and this replica lacks it as a base")
            self.manifests[(rank, version)] = manifest
        return self.manifests[(rank, version)]

    def _resolve(self, bucket: Bucket, version: int) -> torch.Tensor:
        """The verified bytes of ``bucket`` at ``version``: the held copy, or the base's bytes XOR the delta."""
        key = (self.session["root"], self.session["plan"], bucket.index)
        held = _HELD.get(key)
        if held is not None and held[0] == version and held[1].numel() == bucket.nbytes:
            return held[1]
        entry = self._manifest(bucket.sender, version)["buckets"].get(str(bucket.index))
        if entry is None or entry["nbytes"] != bucket.nbytes:
            raise TransportError(f"tensorstore_delta: version {version} of sender {bucket.sender} lacks bucket "
                                 f"{bucket.index} of {bucket.nbytes} bytes")
        if entry["base"] is None:
            flat = torch.zeros(bucket.nbytes, dtype=torch.uint8)
        else:
            flat = self._resolve(bucket, entry["base"]).clone()
        self._apply(bucket, version, entry, flat)
        if bucket_checksum(flat) != entry["checksum"]:
            raise TransportError(f"tensorstore_delta: bucket {bucket.index} of version {version} does not match its "
                                 "manifest's checksum after the delta (corrupted chunk?)")
        _HELD[key] = (version, flat)
        return flat

    def _apply(self, bucket: Bucket, version: int, entry: dict, flat: torch.Tensor) -> None:
        """XOR the written chunks of ``entry`` into ``flat``."""
        path = version_dir(self.session, bucket.sender, version) / f"b{bucket.index}"
        chunk_bytes = entry["chunk_bytes"]
        missing = [c for c in entry["chunks"] if not chunk_file(path, c).exists()]
        if missing:
            raise TransportError(f"tensorstore_delta: bucket {bucket.index} of version {version}: chunks {missing[:5]} "
                                 f"listed in the manifest are missing under {path}")
        if not entry["chunks"]:
            return
        try:
            array = _ts().open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}},
                               open=True).result()
            if _mostly(entry["chunks"], bucket.nbytes, chunk_bytes):  # one read (absent chunks read as zeros)
                _xor_(flat, torch.from_numpy(np.asarray(array.read().result())))
            else:
                reads = [(c, array[slice(*_chunk_range(c, chunk_bytes, bucket.nbytes))].read()) for c in entry["chunks"]]
                for chunk, future in reads:
                    lo, hi = _chunk_range(chunk, chunk_bytes, bucket.nbytes)
                    flat[lo:hi].bitwise_xor_(torch.from_numpy(np.asarray(future.result())))
            # after the read: a chunk that vanished while it was read came back as zeros, and is missing
            read_bytes = sum(chunk_file(path, c).stat().st_size for c in entry["chunks"])
        except FileNotFoundError as err:
            raise TransportError(f"tensorstore_delta: bucket {bucket.index} of version {version}: chunk file "
                                 f"{err.filename} listed in the manifest went missing while it was read") from err
        except Exception as err:
            raise TransportError(f"tensorstore_delta: reading bucket {bucket.index} of version {version} at {path}: "
                                 f"{err}") from err
        self.stats["chunks_read"] += len(entry["chunks"])
        self.stats["bytes_read"] += read_bytes


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
