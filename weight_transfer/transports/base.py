"""The transport interface: a sender puts flat buckets on the wire, a receiver gets them back.

A session is a JSON-able dict the coordinator makes per connection (addresses, names, world size); both
sides build their half from it. Push transports (broadcast, shared memory, CUDA IPC) and pull transports
(RDMA reads, files on a shared filesystem) fit the same two calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import ClassVar

import torch
import torch.distributed as dist

from weight_transfer.buckets import Bucket


class TransportError(RuntimeError):
    """A transport operation failed or timed out (peer gone, rendezvous failed, bucket missing)."""


def sender_store(transport: str, session: dict, sender: int, is_master: bool) -> dist.Store:
    """The key-value store that sender rank ``sender`` hosts at its published address and port, scoped to the
    session, for transports whose receivers look buckets up by key (cuda_ipc handles, nixl metadata)."""
    timeout = timedelta(seconds=session["timeout_s"])
    try:
        store = dist.TCPStore(session["addrs"][str(sender)], session["ports"][str(sender)], None,
                              is_master=is_master, timeout=timeout, wait_for_workers=False)
    except RuntimeError as err:
        raise TransportError(f"{transport}: store of sender {sender} unreachable: {err}") from err
    return dist.PrefixStore(f"wt/{session['id']}", store)


class SenderTransport(ABC):
    """One trainer rank's side."""

    def buffer(self, bucket: Bucket, device: torch.device) -> torch.Tensor:
        """A uint8 buffer of ``bucket.nbytes`` to pack into; transports that can, hand out their own memory."""
        return torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)

    @abstractmethod
    def send(self, version: int, bucket: Bucket, flat: torch.Tensor) -> None:
        """Put one packed bucket on the wire (may return before receivers have it)."""

    def finish(self, version: int) -> None:
        """Called after the last bucket of ``version``; blocks until every bucket is out."""

    def release(self, version: int) -> None:
        """Receivers are done with ``version``: free what was kept for them."""

    def close(self) -> None:
        """Leave the transport and free everything."""


class ReceiverTransport(ABC):
    """One inference worker's side."""

    reads_after_send: ClassVar[bool] = False
    """The senders' send call leaves every bucket where this receiver reads it, and receiving moves no
    bytes (mapped GPU buffers): the worker receives at finish instead of in a call beside the send."""

    @abstractmethod
    def receive(self, version: int, buckets: Sequence[Bucket]) -> Iterator[tuple[Bucket, torch.Tensor]]:
        """Yield each bucket with its flat uint8 buffer, in the order given."""

    def release(self, version: int) -> None:
        """The worker is done with the buffers of ``version``."""

    def close(self) -> None:
        """Leave the transport."""
