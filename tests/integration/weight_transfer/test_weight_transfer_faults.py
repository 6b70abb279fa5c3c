"""Faults during an update: a corrupted bucket, a sender killed mid-transfer and a replica that dies mid-transfer.
Each ends with no replica serving mixed weights, the failure named in the log, and the run able to go on."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

from megatron_rl.tiny import make_tiny_model
from weight_transfer.config import WeightTransferConfig
from weight_transfer.coordinator import WeightTransferCoordinator, WeightTransferError
from weight_transfer.local_senders import LocalSenders
from weight_transfer.replicas import LLMReplica
from wt_helpers import (PerturbedWeights, close_llm, flip_rank0, hf_logprobs, make_llm, max_diff, perturbed,
                        plan_for, vllm_logprobs)

CONFIG = WeightTransferConfig(transport={"type": "broadcast"}, bucket_size_mb=1, timeout_s=20, max_retries=1)


@pytest.fixture(scope="module")
def fleet():
    model = make_tiny_model("qwen3", size="unit", seed=0)
    plan = plan_for(model, tp=2, bucket_bytes=256 << 10)
    llms = [make_llm(model), make_llm(model)]
    yield model, plan, [LLMReplica(llm, f"r{i}") for i, llm in enumerate(llms)]
    for llm in llms:
        close_llm(llm)


def _assert_on_version(model, replicas, version, tmp_path):
    expected = hf_logprobs(model, perturbed(model, version), tmp_path)
    for replica in replicas:
        diff = max_diff(vllm_logprobs(replica.llm), expected)
        assert diff < 1e-3, f"{replica.name} is not on version {version} (log-probs differ by {diff})"


def test_corrupted_bucket_is_refused_then_resent(fleet, tmp_path, caplog):
    model, plan, replicas = fleet
    senders = LocalSenders(plan, PerturbedWeights(model), wrap=flip_rank0)
    try:
        with caplog.at_level(logging.ERROR, logger="weight_transfer"):
            metrics = WeightTransferCoordinator(CONFIG, plan, replicas, senders).update(1)
    finally:
        senders.disconnect()
    assert "bucket checksum mismatch" in caplog.text and "not loaded" in caplog.text
    assert metrics["weight_transfer/retries"] == 1 and metrics["weight_transfer/quarantined"] == 0
    _assert_on_version(model, replicas, 1, tmp_path)


def test_sender_killed_mid_transfer_leaves_old_weights_and_the_run_retries(fleet, tmp_path, caplog):
    model, plan, replicas = fleet
    dying = LocalSenders(plan, PerturbedWeights(model, die_at=(2, 12)))
    coordinator = WeightTransferCoordinator(CONFIG, plan, replicas, dying)
    try:
        with caplog.at_level(logging.ERROR, logger="weight_transfer"), pytest.raises(WeightTransferError, match="died"):
            coordinator.update(2)
    finally:
        dying.disconnect()
    assert "sender rank" in caplog.text and "died" in caplog.text
    assert coordinator.versions == {"r0": None, "r1": None}, "no replica may commit a partial update"
    _assert_on_version(model, replicas, 1, tmp_path)
    coordinator.senders = healthy = LocalSenders(plan, PerturbedWeights(model))
    try:
        coordinator.update(2)
    finally:
        healthy.disconnect()
    _assert_on_version(model, replicas, 2, tmp_path)


def _kill_when(flag, pid: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)


def test_replica_dying_mid_transfer_is_quarantined_and_the_rest_update(fleet, tmp_path, caplog):
    model, plan, replicas = fleet
    victim = replicas[1].call("wt_describe", {}, 30)[0]["pid"]
    started = tmp_path / "sending"
    senders = LocalSenders(plan, PerturbedWeights(model, delay_s=0.15, started=str(started)))
    killer = threading.Thread(target=_kill_when, args=(started, victim), daemon=True)
    coordinator = WeightTransferCoordinator(CONFIG, plan, replicas, senders)
    try:
        killer.start()
        with caplog.at_level(logging.ERROR, logger="weight_transfer"):
            metrics = coordinator.update(3)
    finally:
        senders.disconnect()
    assert not killer.is_alive(), "the replica was never killed"
    assert metrics["weight_transfer/quarantined"] == 1 and "r1" in coordinator.quarantined
    assert replicas[1].quarantined and not replicas[1].serving
    assert "quarantining replica r1" in caplog.text
    assert coordinator.versions["r0"] == 3 and replicas[0].serving
    _assert_on_version(model, replicas[:1], 3, tmp_path)
