"""A transport session: the JSON-able facts both halves need to meet (id, addresses, ports, world size)."""

from __future__ import annotations

import socket
import uuid
from dataclasses import asdict

from weight_transfer.config import WeightTransferConfig
from weight_transfer.plan import TransferPlan

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now on ``host`` (call it on the node that will bind the port)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def local_endpoints(ranks: list[int]) -> dict[int, tuple[str, int]]:
    """Endpoints of senders that run on this host: loopback and a free port each."""
    return {rank: (LOOPBACK, free_port()) for rank in ranks}


def new_session(config: WeightTransferConfig, plan: TransferPlan, num_receivers: int,
                endpoints: dict[int, tuple[str, int]] | None = None) -> dict:
    """A fresh session (new id and ports: a broken one is never reused) for ``num_receivers`` workers.

    ``endpoints`` gives each sending rank's (node address, port chosen on that node) where its rendezvous
    store listens; without it the senders are on this host. An explicit ``transport.master_addr``
    replaces every sender's address (receivers reach the senders there, e.g. through a NAT)."""
    endpoints = endpoints if endpoints is not None else local_endpoints(plan.senders)
    missing = sorted(set(plan.senders) - set(endpoints))
    assert not missing, f"senders {missing} gave no endpoint"
    options = asdict(config.resolved_transport)
    override = options.pop("master_addr", "auto")
    session = {**options, "id": uuid.uuid4().hex[:12], "timeout_s": config.timeout_s,
               "world_size": 1 + num_receivers, "plan": plan.fingerprint}
    session["addrs"] = {str(r): (endpoints[r][0] if override == "auto" else override) for r in plan.senders}
    session["ports"] = {str(r): endpoints[r][1] for r in plan.senders}
    return session
