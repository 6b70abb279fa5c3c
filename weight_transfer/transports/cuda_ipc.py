"""CUDA IPC for a trainer and a sampler on the same GPU: one IPC handle per bucket, published in a small
rendezvous store the sender hosts; the receiver maps the sender's buffer (no copy) until it releases it."""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import reduce_tensor

from weight_transfer.buckets import Bucket
from weight_transfer.transports.base import ReceiverTransport, SenderTransport, TransportError

_DEVICE_ARG = 6  # position of the device index in reduce_tensor's rebuild arguments for CUDA tensors


def _store(session: dict, sender: int, is_master: bool) -> dist.Store:
    timeout = timedelta(seconds=session["timeout_s"])
    try:
        store = dist.TCPStore(session["master_addr"], session["ports"][str(sender)], None,
                              is_master=is_master, timeout=timeout, wait_for_workers=False)
    except RuntimeError as err:
        raise TransportError(f"cuda_ipc: store of sender {sender} unreachable: {err}") from err
    return dist.PrefixStore(f"wt/{session['id']}", store)


def _local_index(uuid: str) -> int:
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise TransportError(f"cuda_ipc: GPU {uuid} is not visible here; cuda_ipc needs trainer and sampler colocated")


class CudaIpcSender(SenderTransport):
    def __init__(self, session: dict, rank: int, device: torch.device):
        if device.type != "cuda":
            raise ValueError(f"weight_transfer.transport.type=cuda_ipc: buffers must be on CUDA, not {device}")
        self.store = _store(session, rank, is_master=True)
        self.uuid = str(torch.cuda.get_device_properties(device).uuid)
        self.kept: dict[int, list[torch.Tensor]] = {}

    def send(self, version: int, bucket: Bucket, flat: torch.Tensor) -> None:
        torch.cuda.current_stream(flat.device).synchronize()
        rebuild, args = reduce_tensor(flat)
        handle = base64.b64encode(pickle.dumps((self.uuid, rebuild, args))).decode()
        self.store.set(f"v{version}/b{bucket.index}", handle)
        self.kept.setdefault(version, []).append(flat)

    def release(self, version: int) -> None:
        self.kept.pop(version, None)

    def close(self) -> None:
        self.kept = {}


class CudaIpcReceiver(ReceiverTransport):
    def __init__(self, session: dict, rank: int, device: torch.device):
        self.stores = {int(s): _store(session, int(s), is_master=False) for s in session["ports"]}
        self.mapped: dict[int, list[torch.Tensor]] = {}

    def receive(self, version: int, buckets: Sequence[Bucket]) -> Iterator[tuple[Bucket, torch.Tensor]]:
        for bucket in buckets:
            try:
                raw = self.stores[bucket.sender].get(f"v{version}/b{bucket.index}")
            except RuntimeError as err:
                raise TransportError(f"cuda_ipc: no handle for bucket {bucket.index} of version {version}: {err}") from err
            uuid, rebuild, args = pickle.loads(base64.b64decode(raw))
            args = list(args)
            args[_DEVICE_ARG] = _local_index(uuid)
            flat = rebuild(*args)
            self.mapped.setdefault(version, []).append(flat)
            yield bucket, flat

    def release(self, version: int) -> None:
        self.mapped.pop(version, None)
        torch.cuda.ipc_collect()

    def close(self) -> None:
        self.mapped = {}
        self.stores = {}
