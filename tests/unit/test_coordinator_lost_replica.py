"""A replica whose node died answers nothing: the coordinator stops waiting for it once the ``lost`` probe names
it and quarantines it without retries, while a replica that is merely slow is still waited for. The replicas
and senders here keep the protocol's bookkeeping only (no bytes move); the transfer itself is tested with real
engines in tests/integration/weight_transfer."""

from __future__ import annotations

import threading
import time

import pytest

from weight_transfer import coordinator as coordinator_module
from weight_transfer.config import WeightTransferConfig
from weight_transfer.coordinator import WeightTransferCoordinator
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TensorSpec, TransferPlan
from weight_transfer.replicas import ReplicaDown

PLAN = TransferPlan.build([TensorSpec("model.norm.weight", (8,), "float32")], TrainerLayout(num_layers=1), 1 << 20)
CONFIG = WeightTransferConfig(transport={"type": "broadcast"}, timeout_s=30, max_retries=2)


class Senders:
    def endpoints(self, ranks):
        return {r: ("127.0.0.1", 1) for r in ranks}

    def connect(self, session):
        pass

    def send(self, version, digests):
        return {"buckets": {0: f"sum{version}"}, "tensors": {}}

    def release(self, version):
        pass

    def disconnect(self):
        pass


class Replica:
    """Answers every call at once, except ``stall`` (a method name), which takes ``stall_s`` and then answers, or
    never answers before the call's own timeout when ``stall_s`` is None (its host is gone)."""

    def __init__(self, name: str, stall: str | None = None, stall_s: float | None = None):
        self.name, self.stall, self.stall_s = name, stall, stall_s
        self.calls: list[str] = []
        self.quarantined = None
        self.unblock = threading.Event()

    def call(self, method, payload, timeout_s):
        self.calls.append(method)
        if method == self.stall:
            if self.stall_s is None:
                self.unblock.wait(timeout_s)
                raise ReplicaDown(f"{self.name}: {method}: timed out")
            time.sleep(self.stall_s)
        if method == "wt_describe":
            return [{"load_error": None, "load": "reload", "plan": PLAN.fingerprint}]
        if method == "wt_finish":
            return [{"ok": True, "version": payload["version"], "checksums": payload["expected"], "tensors": {},
                     "load_seconds": 0.0, "seconds": 0.0, "verify_seconds": 0.0}]
        return [{"ok": True, "seconds": 0.0}]

    def pause(self, mode):
        pass

    def resume(self):
        pass

    def healthy(self):  # answered before the update began
        return True

    def quarantine(self, reason):
        self.quarantined = reason


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(coordinator_module, "LOST_POLL_S", 0.1)


def _lost_after(seconds: float, names: dict[str, str]):
    start = time.monotonic()
    return lambda: names if time.monotonic() - start > seconds else {}


@pytest.mark.parametrize("stall", ["wt_receive", "wt_finish"])
def test_a_replica_on_a_lost_node_is_quarantined_without_waiting_out_its_timeout(stall):
    alive, dead = Replica("a"), Replica("b", stall=stall)
    coordinator = WeightTransferCoordinator(CONFIG, PLAN, [alive, dead], Senders(),
                                            lost=_lost_after(0.5, {"b": "its node 10.0.0.2 is lost"}))
    try:
        start = time.monotonic()
        metrics = coordinator.update(1)
        took = time.monotonic() - start
    finally:
        dead.unblock.set()
    assert took < 5, f"waited {took:.1f} s for a replica whose node is lost (its call's timeout is 90 s)"
    assert coordinator.versions == {"a": 1, "b": None}
    assert "its node 10.0.0.2 is lost" in coordinator.quarantined["b"] and dead.quarantined
    assert dead.calls.count(stall) == 1, f"a lost replica is not retried: {dead.calls}"
    assert metrics["weight_transfer/quarantined"] == 1 and alive.quarantined is None


def test_a_slow_replica_that_no_probe_names_is_waited_for():
    slow = Replica("b", stall="wt_finish", stall_s=1.0)
    probes = []
    coordinator = WeightTransferCoordinator(CONFIG, PLAN, [Replica("a"), slow], Senders(),
                                            lost=lambda: probes.append(1) or {})
    metrics = coordinator.update(1)
    assert coordinator.versions == {"a": 1, "b": 1} and not coordinator.quarantined
    assert metrics["weight_transfer/retries"] == 0 and len(probes) >= 3, "the probe is asked while the call runs"
