"""Faults during an update: a corrupted bucket, a sender killed mid-transfer and a replica that dies mid-transfer
(with a receive call beside the send, and with a transport the replicas read at finish).
Each ends with every replica on exactly the old or the new weights (log-probs equal one model, the two models
differ by far more than the tolerance), the failure named in the log, and the next update succeeding."""

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
from weight_transfer.transports.shared_memory import SharedMemoryReceiver
from wt_helpers import (PerturbedWeights, ProbeAfterFirstAttempt, checkpoint, close_llm, flip_rank0, hf_logprobs,
                        make_llm, max_diff, perturbed, plan_for, vllm_logprobs)

CONFIG = WeightTransferConfig(transport={"type": "broadcast"}, bucket_size_mb=1, timeout_s=30, max_retries=1)
TOLERANCE = 1e-3
pytestmark = pytest.mark.timeout(900)


class Fleet:
    """Two engines on the tiny model, and transformers' log-probs of each version (0: the checkpoint)."""

    def __init__(self, model, tmp_path):
        self.model, self.tmp_path = model, tmp_path
        self.plan = plan_for(model, tp=2, bucket_bytes=256 << 10)
        self.llms = []
        for _ in range(2):
            self.llms.append(make_llm(model))
        self.replicas = [LLMReplica(llm, f"r{i}") for i, llm in enumerate(self.llms)]
        self._expected = {}

    def expected(self, version: int):
        if version not in self._expected:
            tensors = checkpoint(self.model) if version == 0 else perturbed(self.model, version)
            self._expected[version] = hf_logprobs(self.model, tensors, self.tmp_path)
        return self._expected[version]

    def version_of(self, logprobs, candidates) -> int:
        """The one candidate version these log-probs equal; fails on a mix (they equal none)."""
        diffs = {v: max_diff(logprobs, self.expected(v)) for v in candidates}
        for v in candidates:
            for w in candidates:
                if v < w:
                    assert max_diff(self.expected(v), self.expected(w)) > 50 * TOLERANCE, "versions must be distinct"
        matches = [v for v, d in diffs.items() if d < TOLERANCE]
        assert len(matches) == 1, f"log-probs match no single version (mixed weights?): max diffs {diffs}"
        return matches[0]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = Fleet(make_tiny_model("qwen3", size="unit", seed=0), tmp_path_factory.mktemp("faults"))
    yield fleet
    for llm in fleet.llms:
        close_llm(llm)


def _versions(fleet, replicas, candidates) -> dict[str, int]:
    return {r.name: fleet.version_of(vllm_logprobs(r.llm), candidates) for r in replicas}


def test_corrupted_bucket_is_refused_then_resent(fleet, caplog):
    before = _versions(fleet, fleet.replicas, [0])
    senders = ProbeAfterFirstAttempt(LocalSenders(fleet.plan, PerturbedWeights(fleet.model), wrap=flip_rank0),
                                     probe=lambda: [vllm_logprobs(r.llm) for r in fleet.replicas])
    try:
        with caplog.at_level(logging.ERROR, logger="weight_transfer"):
            metrics = WeightTransferCoordinator(CONFIG, fleet.plan, fleet.replicas, senders).update(1)
    finally:
        senders.disconnect()
    assert "bucket checksum mismatch" in caplog.text and "not loaded" in caplog.text
    assert metrics["weight_transfer/retries"] == 1 and metrics["weight_transfer/quarantined"] == 0
    after_refusal = {r.name: fleet.version_of(lp, [0, 1]) for r, lp in zip(fleet.replicas, senders.probed)}
    assert after_refusal == before, "a replica that refused a corrupted bucket must keep its old weights"
    assert _versions(fleet, fleet.replicas, [0, 1]) == {"r0": 1, "r1": 1}


def test_sender_killed_mid_transfer_leaves_old_weights_and_the_run_retries(fleet, caplog):
    before = _versions(fleet, fleet.replicas, [0, 1])
    dying = LocalSenders(fleet.plan, PerturbedWeights(fleet.model, die_at=(2, 12)))
    coordinator = WeightTransferCoordinator(CONFIG, fleet.plan, fleet.replicas, dying)
    try:
        with caplog.at_level(logging.ERROR, logger="weight_transfer"), pytest.raises(WeightTransferError, match="died"):
            coordinator.update(2)
    finally:
        dying.disconnect()
    assert "sender rank" in caplog.text and "died" in caplog.text
    assert coordinator.versions == {"r0": None, "r1": None}, "no replica may commit a partial update"
    assert all(r.serving for r in fleet.replicas), "after a failed update the fleet serves its old weights"
    assert _versions(fleet, fleet.replicas, [0, 1, 2]) == before
    coordinator.senders = healthy = LocalSenders(fleet.plan, PerturbedWeights(fleet.model))
    try:
        metrics = coordinator.update(2)
    finally:
        healthy.disconnect()
    assert metrics["weight_transfer/quarantined"] == 0
    assert _versions(fleet, fleet.replicas, [0, 1, 2]) == {"r0": 2, "r1": 2}


def test_an_export_that_raises_mid_send_fails_the_attempt_at_once_and_the_retry_lands(fleet, caplog):
    """The sender process lives on after its export raised: its transport closes, so the replicas blocked on its
    buckets fail now instead of waiting out weight_transfer.timeout_s, and the retry moves both to the version."""
    raising = LocalSenders(fleet.plan, PerturbedWeights(fleet.model, raise_at=(3, 12)))
    coordinator = WeightTransferCoordinator(CONFIG, fleet.plan, fleet.replicas, raising)
    start = time.monotonic()
    try:
        with caplog.at_level(logging.ERROR, logger="weight_transfer"):
            metrics = coordinator.update(3)
    finally:
        raising.disconnect()
    elapsed = time.monotonic() - start
    assert "export failed at tensor 12 of version 3" in caplog.text
    assert metrics["weight_transfer/retries"] == 1 and metrics["weight_transfer/quarantined"] == 0
    assert elapsed < CONFIG.timeout_s / 2, f"{elapsed:.1f} s: the replicas waited for the failed sender's buckets"
    assert _versions(fleet, fleet.replicas, [0, 1, 2, 3]) == {"r0": 3, "r1": 3}
    healthy = LocalSenders(fleet.plan, PerturbedWeights(fleet.model))
    try:  # back to version 2, which the tests below start from
        WeightTransferCoordinator(CONFIG, fleet.plan, fleet.replicas, healthy).update(2)
    finally:
        healthy.disconnect()


def test_an_in_place_load_the_replicas_cannot_do_is_refused_before_anything_moves(fleet):
    """vLLM on CPU repacks linear weights after loading, so ``load=direct`` (in-place writes) is refused up front."""
    before = _versions(fleet, fleet.replicas, [0, 1, 2])
    config = WeightTransferConfig(transport={"type": "broadcast"}, bucket_size_mb=1, timeout_s=30, load="direct")
    senders = LocalSenders(fleet.plan, PerturbedWeights(fleet.model))
    coordinator = WeightTransferCoordinator(config, fleet.plan, fleet.replicas, senders)
    try:
        with pytest.raises(ValueError, match=r"weight_transfer\.load=direct: replica r0: .*repacks.*load=auto"):
            coordinator.update(4)
    finally:
        senders.disconnect()
    assert all(r.serving for r in fleet.replicas) and coordinator.quarantined == {}
    assert _versions(fleet, fleet.replicas, [0, 1, 2]) == before
    described = fleet.replicas[0].call("wt_describe", {"load": "auto"}, 30)
    assert [d["load"] for d in described] == ["reload"], "auto must fall back to reload_weights on CPU"


def test_an_update_leaves_no_prefix_blocks_of_the_old_weights(fleet):
    """A prompt cached before an update is recomputed after it: what a request reads through the prefix cache
    equals what it computes from a cold cache (prompt log-probs alone would not show it: they skip the cache)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = fleet.llms[0]
    prompt = TokensPrompt(prompt_token_ids=[(7 * i) % 1900 + 3 for i in range(200)])  # a whole 128-token CPU block
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0)

    def next_token():
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        return out.token_ids[0], out.logprobs[0][out.token_ids[0]].logprob

    before = next_token()  # fills the cache under the current weights
    senders = LocalSenders(fleet.plan, PerturbedWeights(fleet.model))
    try:
        WeightTransferCoordinator(CONFIG, fleet.plan, fleet.replicas, senders).update(5)
    finally:
        senders.disconnect()
    after = next_token()
    llm.reset_prefix_cache()
    cold = next_token()
    assert after[0] == cold[0] and abs(after[1] - cold[1]) < 1e-4, f"stale prefix blocks: {after} vs cold {cold}"
    assert before != cold, "the update must change the next token's log-prob"


def _kill_when(flag, pid: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)


def _update_killing_the_second(fleet, replicas, config, version: int, tmp_path, caplog):
    """Update ``replicas`` to ``version`` while the second one's engine is SIGKILLed a second into the send
    (the senders take 0.15 s a tensor); returns the coordinator and its metrics."""
    victim = replicas[1].call("wt_describe", {}, 30)[0]["pid"]
    started = tmp_path / "sending"
    senders = LocalSenders(fleet.plan, PerturbedWeights(fleet.model, delay_s=0.15, started=str(started)))
    killer = threading.Thread(target=_kill_when, args=(started, victim), daemon=True)
    coordinator = WeightTransferCoordinator(config, fleet.plan, replicas, senders)
    try:
        killer.start()
        with caplog.at_level(logging.ERROR, logger="weight_transfer"):
            metrics = coordinator.update(version)
    finally:
        senders.disconnect()
        killer.join(5)
    assert not killer.is_alive(), "the replica was never killed"
    return coordinator, metrics


def test_replica_dying_before_it_stages_at_finish_is_quarantined(fleet, tmp_path, caplog, monkeypatch):
    """Where replicas stage at finish (CUDA IPC; here shared memory on CPU, which moves no bytes to receive
    either) no receive call sees a replica die while the senders write: its pause or finish does."""
    monkeypatch.setattr(SharedMemoryReceiver, "reads_after_send", True)
    spare = make_llm(fleet.model)
    replicas = [fleet.replicas[0], LLMReplica(spare, "spare")]
    config = WeightTransferConfig(transport={"type": "shared_memory"}, bucket_size_mb=1, timeout_s=30, max_retries=1)
    try:
        coordinator, metrics = _update_killing_the_second(fleet, replicas, config, 6, tmp_path, caplog)
    finally:
        close_llm(spare)
    assert metrics["weight_transfer/receive_seconds"] == 0, "no receive call: the replicas stage at finish"
    assert coordinator.quarantined.keys() == {"spare"} and "quarantining replica spare" in caplog.text
    assert coordinator.versions["r0"] == 6 and replicas[0].serving
    assert _versions(fleet, replicas[:1], [5, 6]) == {"r0": 6}


def test_replica_dying_mid_transfer_is_quarantined_and_the_rest_update(fleet, tmp_path, caplog):
    replicas = fleet.replicas
    coordinator, metrics = _update_killing_the_second(fleet, replicas, CONFIG, 3, tmp_path, caplog)
    assert metrics["weight_transfer/quarantined"] == 1 and "r1" in coordinator.quarantined
    assert replicas[1].quarantined and not replicas[1].serving
    assert "quarantining replica r1" in caplog.text
    assert coordinator.versions["r0"] == 3 and replicas[0].serving
    assert _versions(fleet, replicas[:1], [2, 3]) == {"r0": 3}
