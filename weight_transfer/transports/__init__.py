"""Transports by config ``type``: each builds its sender and receiver half from a session dict."""

from __future__ import annotations

import torch

from weight_transfer.transports.base import ReceiverTransport, SenderTransport, TransportError
from weight_transfer.transports.broadcast import BroadcastReceiver, BroadcastSender
from weight_transfer.transports.cuda_ipc import CudaIpcReceiver, CudaIpcSender
from weight_transfer.transports.nixl import NixlReceiver, NixlSender
from weight_transfer.transports.shared_memory import SharedMemoryReceiver, SharedMemorySender
from weight_transfer.transports.tensorstore_delta import TensorstoreDeltaReceiver, TensorstoreDeltaSender

TRANSPORTS: dict[str, tuple[type[SenderTransport], type[ReceiverTransport]]] = {
    "broadcast": (BroadcastSender, BroadcastReceiver),
    "shared_memory": (SharedMemorySender, SharedMemoryReceiver),
    "cuda_ipc": (CudaIpcSender, CudaIpcReceiver),
    "tensorstore_delta": (TensorstoreDeltaSender, TensorstoreDeltaReceiver),
    "nixl": (NixlSender, NixlReceiver),
}


def _pair(session: dict) -> tuple[type[SenderTransport], type[ReceiverTransport]]:
    if session["type"] not in TRANSPORTS:
        raise ValueError(f"weight_transfer.transport.type={session['type']!r}: use one of {sorted(TRANSPORTS)}")
    return TRANSPORTS[session["type"]]


def receives_after_send(transport_type: str) -> bool:
    """Whether receivers of this transport stage an update's buckets at finish (``reads_after_send``)."""
    return _pair({"type": transport_type})[1].reads_after_send


def make_sender(session: dict, rank: int, device: torch.device) -> SenderTransport:
    """The sending half for trainer ``rank``."""
    return _pair(session)[0](session, rank, device)


def make_receiver(session: dict, rank: int, device: torch.device) -> ReceiverTransport:
    """The receiving half for inference worker ``rank`` (1-based within the session)."""
    return _pair(session)[1](session, rank, device)


__all__ = ["ReceiverTransport", "SenderTransport", "TransportError", "make_receiver", "make_sender", "receives_after_send",
           "TRANSPORTS"]
