"""tensorstore_delta through a temporary folder: TP=2 trainer ranks (processes) write versions as deltas,
2 vLLM CPU replicas fetch them before the pause and load them; afterwards vLLM's log-probs equal
transformers' with the new weights (dense; MoE on one replica). A lost or damaged chunk fails the first
attempt with every replica still on its old weights; the retry (written whole) brings both to the new one.
A replica restarted mid-fetch (back on the checkpoint, with no plan, session or base) rejoins the same update
and ends on the new version, like the one that never stopped."""

from __future__ import annotations

import json
import logging

import pytest

from weight_transfer.config import WeightTransferConfig
from weight_transfer.coordinator import WeightTransferCoordinator
from weight_transfer.local_senders import LocalSenders
from weight_transfer.transports import tensorstore_delta as tsd
from wt_helpers import (PerturbedWeights, ReplicaFleet, corrupt_a_chunk, lose_a_chunk, max_diff, update_restarting,
                        vllm_logprobs)

pytestmark = pytest.mark.timeout(900)


def _config(root, max_retries=0, rejoin_wait_s=0.0):
    return WeightTransferConfig(transport={"type": "tensorstore_delta", "root": str(root), "chunk_kb": 64},
                                bucket_size_mb=1, timeout_s=30, max_retries=max_retries, rejoin_wait_s=rejoin_wait_s)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    fleet = ReplicaFleet("qwen3", tmp_path_factory.mktemp("tsd-dense"), engines=2)
    yield fleet
    fleet.close()


def _manifests(root, plan, version):
    return [json.loads(tsd.manifest_path({"root": str(root), "plan": plan.fingerprint}, r, version).read_text())
            for r in plan.senders]


def test_deltas_reach_two_replicas_and_match_transformers(dense, tmp_path):
    senders = LocalSenders(dense.plan, PerturbedWeights(dense.model))
    coordinator = WeightTransferCoordinator(_config(tmp_path), dense.plan, dense.replicas, senders)
    try:
        for version in (1, 2):
            metrics = coordinator.update(version)
            assert metrics["weight_transfer/retries"] == 0 and metrics["weight_transfer/quarantined"] == 0
            assert metrics["weight_transfer/receive_seconds"] > 0, "replicas fetch in their receive call, before the pause"
            assert max_diff(dense.on(version), dense.on(version - 1)) > 0.05, "versions must differ measurably"
            assert dense.versions([version - 1, version]) == {"r0": version, "r1": version}
            manifests = _manifests(tmp_path, dense.plan, version)
            bases = {e["base"] for m in manifests for e in m["buckets"].values()}
            assert bases == ({None} if version == 1 else {version - 1}), f"v{version}: bases {bases}"
    finally:
        senders.disconnect()
    kept = sorted(p.name for r in dense.plan.senders for p in tsd.rank_dir(
        {"root": str(tmp_path), "plan": dense.plan.fingerprint}, r).iterdir())
    assert kept == ["v1", "v1", "v2", "v2"], "nothing older than the last full version to collect yet"


class ProbeAfterFirstRelease:
    """Senders that read every replica's log-probs when ``version``'s first attempt is released (the
    coordinator has finished that attempt and nothing is in flight)."""

    def __init__(self, inner, version, probe):
        self.inner, self.version, self.probe, self.probed = inner, version, probe, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def release(self, version):
        self.inner.release(version)
        if version == self.version and self.probed is None:
            self.probed = self.probe()


@pytest.mark.parametrize("fault", ["missing", "corrupted"])
def test_a_lost_or_damaged_chunk_leaves_old_weights_then_the_retry_lands(dense, tmp_path, caplog, fault):
    start = 10 if fault == "missing" else 20
    wrap = lose_a_chunk if fault == "missing" else corrupt_a_chunk
    senders = ProbeAfterFirstRelease(LocalSenders(dense.plan, PerturbedWeights(dense.model), wrap=wrap), start + 1,
                                     probe=lambda: [vllm_logprobs(llm) for llm in dense.llms])
    coordinator = WeightTransferCoordinator(_config(tmp_path, max_retries=1), dense.plan, dense.replicas, senders)
    try:
        assert coordinator.update(start)["weight_transfer/retries"] == 0  # a fresh sender process writes whole
        with caplog.at_level(logging.ERROR, logger="weight_transfer"):
            metrics = coordinator.update(start + 1)  # the first delta: one chunk spoiled per sender
    finally:
        senders.disconnect()
    assert ("missing" if fault == "missing" else "tensorstore_delta: ") in caplog.text, caplog.text[-2000:]
    assert metrics["weight_transfer/retries"] == 1 and metrics["weight_transfer/quarantined"] == 0
    assert dense.versions([start, start + 1], senders.probed) == {"r0": start, "r1": start}, \
        "a replica whose fetch failed must keep its old weights"
    assert dense.versions([start, start + 1]) == {"r0": start + 1, "r1": start + 1}
    assert all(m["full"] for m in _manifests(tmp_path, dense.plan, start + 1)), "the resent version is whole"


def test_a_replica_restarted_mid_fetch_rejoins_on_the_new_version(dense, tmp_path, caplog):
    started = tmp_path / "sending"
    senders = LocalSenders(dense.plan, PerturbedWeights(dense.model, delay_s=0.15, started=str(started)))
    coordinator = WeightTransferCoordinator(_config(tmp_path, max_retries=1, rejoin_wait_s=300), dense.plan,
                                            dense.replicas, senders)
    try:
        assert coordinator.update(30)["weight_transfer/retries"] == 0
        with caplog.at_level(logging.WARNING, logger="weight_transfer"):
            metrics = update_restarting(dense, coordinator, 31, started)  # a delta: the restarted replica has no base
    finally:
        senders.disconnect()
    assert "version 31 to replica r1 failed" in caplog.text and "rejoin_wait_s" in caplog.text, caplog.text[-2000:]
    assert metrics["weight_transfer/retries"] == 1 and metrics["weight_transfer/quarantined"] == 0
    assert coordinator.versions == {"r0": 31, "r1": 31}
    assert dense.versions([0, 30, 31]) == {"r0": 31, "r1": 31}, "the restarted replica must serve the new version whole"


def test_moe_delta_matches_transformers(tmp_path):
    fleet = ReplicaFleet("qwen3_moe", tmp_path, engines=1)
    senders = LocalSenders(fleet.plan, PerturbedWeights(fleet.model))
    coordinator = WeightTransferCoordinator(_config(tmp_path / "root"), fleet.plan, fleet.replicas, senders)
    try:
        for version in (1, 2):
            assert coordinator.update(version)["weight_transfer/retries"] == 0
            assert fleet.versions([version - 1, version]) == {"r0": version}
        assert not any(m["full"] for m in _manifests(tmp_path / "root", fleet.plan, 2))
    finally:
        senders.disconnect()
        fleet.close()
