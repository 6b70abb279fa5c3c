"""Broadcast over a private process group per sender rank: the sender is rank 0 (and hosts the rendezvous
store), every inference worker joins with its own rank. NCCL when buffers live on CUDA, gloo otherwise;
the groups are independent of the trainer's and vLLM's own process groups."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from weight_transfer.buckets import Bucket
from weight_transfer.transports.base import ReceiverTransport, SenderTransport, TransportError


def route_address(peer: str) -> str:
    """This host's address on the route toward ``peer`` (the node address a group member is reached at)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((peer, 9))  # a datagram socket only picks the route; nothing is sent
        return sock.getsockname()[0]


def _gloo(store: dist.Store, rank: int, world: int, timeout: timedelta, host: str) -> dist.ProcessGroupGloo:
    """A gloo group whose members listen on ``host``, not on whatever this host's name resolves to."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, world, options)


def _group(session: dict, sender: int, rank: int, device: torch.device) -> dist.ProcessGroup:
    timeout = timedelta(seconds=session["timeout_s"])
    world = session["world_size"]
    host = session["addrs"][str(sender)]
    try:
        store = dist.TCPStore(host, session["ports"][str(sender)], world,
                              is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        store = dist.PrefixStore(f"wt/{session['id']}", store)
        if _backend(session, device) == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            group = dist.ProcessGroupNCCL(store, rank, world, options)
            return group
        return _gloo(store, rank, world, timeout, route_address(host))
    except RuntimeError as err:
        raise TransportError(f"broadcast: joining the group of sender {sender} as rank {rank} failed: {err}") from err


def _backend(session: dict, device: torch.device) -> str:
    backend = session.get("backend", "auto")
    return ("nccl" if device.type == "cuda" else "gloo") if backend == "auto" else backend


def _wait(work, what: str) -> None:
    try:
        work.wait()
    except RuntimeError as err:
        raise TransportError(f"broadcast: {what} failed: {err}") from err


class BroadcastSender(SenderTransport):
    def __init__(self, session: dict, rank: int, device: torch.device):
        self.group = _group(session, rank, 0, device)
        self.pending: list[tuple[int, object, torch.Tensor]] = []

    def send(self, version: int, bucket: Bucket, flat: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pending.append((bucket.index, self.group.broadcast([flat], opts), flat))

    def finish(self, version: int) -> None:
        pending, self.pending = self.pending, []
        for index, work, _ in pending:
            _wait(work, f"sending bucket {index} of version {version}")

    def close(self) -> None:
        self.pending = []
        self.group = None


class BroadcastReceiver(ReceiverTransport):
    def __init__(self, session: dict, rank: int, device: torch.device):
        self.device = device
        self.groups = {int(s): _group(session, int(s), rank, device) for s in sorted(session["ports"], key=int)}

    def receive(self, version: int, buckets: Sequence[Bucket]) -> Iterator[tuple[Bucket, torch.Tensor]]:
        posted = []
        for bucket in buckets:
            flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=self.device)
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            posted.append((bucket, flat, self.groups[bucket.sender].broadcast([flat], opts)))
        for bucket, flat, work in posted:
            _wait(work, f"receiving bucket {bucket.index} of version {version} from rank {bucket.sender}")
            yield bucket, flat

    def close(self) -> None:
        self.groups = {}
