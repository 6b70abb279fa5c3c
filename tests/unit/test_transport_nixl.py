"""The nixl transport with real NIXL agents (UCX, DRAM) in one process, a sender agent and a receiver agent:
every bucket of two senders arrives byte-exact; registrations are made once per plan and reused by later
versions and sessions; a new plan registers afresh; a bucket never published fails the receive by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("nixl_cu12", reason="the rdma extra (nixl-cu12) is not installed")

from weight_transfer.buckets import pack  # noqa: E402
from weight_transfer.config import WeightTransferConfig  # noqa: E402
from weight_transfer.layout import TrainerLayout  # noqa: E402
from weight_transfer.plan import TensorSpec, TransferPlan  # noqa: E402
from weight_transfer.sender import send_weights  # noqa: E402
from weight_transfer.session import new_session  # noqa: E402
from weight_transfer.transports import TransportError, make_receiver, make_sender  # noqa: E402
from weight_transfer.transports import nixl  # noqa: E402

CPU = torch.device("cpu")


def _plan(n: int) -> TransferPlan:
    specs = [TensorSpec(f"model.layers.{i}.mlp.up_proj.weight", (1 << 16,), "float32") for i in range(n)]
    return TransferPlan.build(specs, TrainerLayout(num_layers=n, tp=2), 1 << 20, senders="spread")


def _update(plan, weights, version, timeout_s=10.0):
    config = WeightTransferConfig(transport={"type": "nixl"}, timeout_s=timeout_s)
    session = new_session(config, plan, 1)
    senders = {r: make_sender(session, r, CPU) for r in plan.senders}
    receiver = make_receiver(session, 1, CPU)
    try:
        for rank, transport in senders.items():
            send_weights(plan, rank, weights.items(), transport, version, CPU)
        return {b.index: flat.clone() for b, flat in receiver.receive(version, plan.buckets)}
    finally:
        receiver.close()
        for transport in senders.values():
            transport.close()


def _weights(plan, version):
    return {e.spec.name: torch.full((1 << 16,), float(version * 1000 + i)) for i, e in enumerate(plan.entries)}


def test_buckets_arrive_exact_and_registrations_are_reused_until_the_plan_changes():
    plan = _plan(12)  # 3 MiB from 2 sender ranks in 1 MiB buckets
    assert plan.senders == [0, 1] and len(plan.buckets) >= 4
    before = dict(nixl.REGISTRATIONS)
    for version in (1, 2, 3):  # a new session each time, as after a coordinator retry
        weights = _weights(plan, version)
        got = _update(plan, weights, version)
        for bucket in plan.buckets:
            want = pack(bucket, weights, torch.empty(bucket.nbytes, dtype=torch.uint8))
            assert torch.equal(got[bucket.index], want), f"v{version} bucket {bucket.index}"
    registered = {role: nixl.REGISTRATIONS[role] - before[role] for role in before}
    assert registered == {"sender": len(plan.buckets), "receiver": len(plan.buckets)}, registered
    other = _plan(8)
    weights = _weights(other, 4)
    got = _update(other, weights, 4)
    assert nixl.REGISTRATIONS["receiver"] - before["receiver"] == len(plan.buckets) + len(other.buckets)
    assert all(torch.equal(got[b.index], pack(b, weights, torch.empty(b.nbytes, dtype=torch.uint8)))
               for b in other.buckets)
    assert not any(key[1] == plan.fingerprint for key in nixl._REGISTERED), "the old plan's buffers are deregistered"


def test_a_bucket_never_published_fails_the_receive_by_name():
    plan = _plan(4)
    config = WeightTransferConfig(transport={"type": "nixl"}, timeout_s=1.0)
    session = new_session(config, plan, 1)
    senders = {r: make_sender(session, r, CPU) for r in plan.senders}
    receiver = make_receiver(session, 1, CPU)
    try:
        send_weights(plan, 0, _weights(plan, 1).items(), senders[0], 1, CPU)  # rank 1 never sends
        with pytest.raises(TransportError, match="not published by sender 1"):
            list(receiver.receive(1, plan.buckets))
    finally:
        receiver.close()
        for transport in senders.values():
            transport.close()
