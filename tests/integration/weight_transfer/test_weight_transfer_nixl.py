"""nixl between processes: TP=2 trainer ranks (processes, NIXL agents over UCX in DRAM) -> 2 vLLM CPU
replicas whose workers pull every bucket from the rank that owns it; afterwards vLLM's log-probs equal
transformers' with the new weights (dense; MoE on one replica). A trainer rank that dies mid-update leaves
every replica on its old weights, and the next update lands. A replica restarted mid-pull rejoins the same
update on the new version."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("nixl_cu12", reason="the rdma extra (nixl-cu12) is not installed")

from weight_transfer.config import WeightTransferConfig  # noqa: E402
from weight_transfer.coordinator import WeightTransferCoordinator, WeightTransferError  # noqa: E402
from weight_transfer.local_senders import LocalSenders  # noqa: E402
from wt_helpers import PerturbedWeights, ReplicaFleet, max_diff, update_restarting  # noqa: E402

CONFIG = WeightTransferConfig(transport={"type": "nixl"}, bucket_size_mb=1, timeout_s=30, max_retries=0)
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    fleet = ReplicaFleet("qwen3", tmp_path_factory.mktemp("nixl-dense"), engines=2)
    yield fleet
    fleet.close()


def test_pulls_reach_two_replicas_and_match_transformers(dense):
    assert dense.plan.senders == [0, 1] and len(dense.plan.buckets) > 2
    senders = LocalSenders(dense.plan, PerturbedWeights(dense.model))
    coordinator = WeightTransferCoordinator(CONFIG, dense.plan, dense.replicas, senders)
    try:
        for version in (1, 2):  # one session: the second version reuses registrations and transfer handles
            metrics = coordinator.update(version)
            assert metrics["weight_transfer/retries"] == 0 and metrics["weight_transfer/quarantined"] == 0
            assert metrics["weight_transfer/receive_seconds"] > 0, "workers pull beside the send, before the pause"
            assert max_diff(dense.on(version), dense.on(version - 1)) > 0.05, "versions must differ measurably"
            assert dense.versions([version - 1, version]) == {"r0": version, "r1": version}
    finally:
        senders.disconnect()


def test_a_trainer_rank_dying_mid_update_leaves_old_weights(dense, caplog):
    before = dense.versions([0, 1, 2])
    dying = LocalSenders(dense.plan, PerturbedWeights(dense.model, die_at=(3, 12)))
    coordinator = WeightTransferCoordinator(CONFIG, dense.plan, dense.replicas, dying)
    try:
        with caplog.at_level(logging.ERROR, logger="weight_transfer"), pytest.raises(WeightTransferError, match="died"):
            coordinator.update(3)
    finally:
        dying.disconnect()
    assert coordinator.versions == {"r0": None, "r1": None}, "no replica may commit a partial update"
    assert all(r.serving for r in dense.replicas)
    assert dense.versions([0, 1, 2, 3]) == before
    coordinator.senders = healthy = LocalSenders(dense.plan, PerturbedWeights(dense.model))
    try:
        assert coordinator.update(3)["weight_transfer/quarantined"] == 0
    finally:
        healthy.disconnect()
    assert dense.versions([2, 3]) == {"r0": 3, "r1": 3}


def test_a_replica_restarted_mid_pull_rejoins_on_the_new_version(dense, tmp_path, caplog):
    started = tmp_path / "sending"
    senders = LocalSenders(dense.plan, PerturbedWeights(dense.model, delay_s=0.15, started=str(started)))
    config = WeightTransferConfig(transport={"type": "nixl"}, bucket_size_mb=1, timeout_s=30, max_retries=1,
                                  rejoin_wait_s=300)
    coordinator = WeightTransferCoordinator(config, dense.plan, dense.replicas, senders)
    try:
        with caplog.at_level(logging.WARNING, logger="weight_transfer"):
            metrics = update_restarting(dense, coordinator, 4, started)
    finally:
        senders.disconnect()
    assert "version 4 to replica r1 failed" in caplog.text and "rejoin_wait_s" in caplog.text, caplog.text[-2000:]
    assert metrics["weight_transfer/retries"] == 1 and metrics["weight_transfer/quarantined"] == 0
    assert dense.versions([0, 3, 4]) == {"r0": 4, "r1": 4}, "the restarted replica must serve the new version whole"


def test_moe_pull_matches_transformers(tmp_path):
    fleet = ReplicaFleet("qwen3_moe", tmp_path, engines=1)
    senders = LocalSenders(fleet.plan, PerturbedWeights(fleet.model))
    try:
        assert WeightTransferCoordinator(CONFIG, fleet.plan, fleet.replicas, senders).update(1)["weight_transfer/retries"] == 0
        assert fleet.versions([0, 1]) == {"r0": 1}
    finally:
        senders.disconnect()
        fleet.close()
