"""A transport session: the JSON-able facts both halves need to meet (id, addresses, ports, world size)."""

from __future__ import annotations

import socket
import uuid
from dataclasses import asdict

from weight_transfer.config import WeightTransferConfig
from weight_transfer.plan import TransferPlan


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def new_session(config: WeightTransferConfig, plan: TransferPlan, num_receivers: int) -> dict:
    """A fresh session (new id and ports: a broken one is never reused) for ``num_receivers`` workers."""
    session = {**asdict(config.resolved_transport), "id": uuid.uuid4().hex[:12], "timeout_s": config.timeout_s,
               "world_size": 1 + num_receivers, "plan": plan.fingerprint}
    session.setdefault("master_addr", "127.0.0.1")
    session["ports"] = {str(rank): free_port() for rank in plan.senders}
    return session
