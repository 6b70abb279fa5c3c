"""TP=2 trainer ranks stream perturbed weights to 2 vLLM CPU replicas over gloo broadcast, then over shared
memory, then over shared memory read at finish (as CUDA IPC is: no receive call beside the send); afterwards
vLLM's log-probs on fixed tokens equal transformers' with the new weights (dense, MoE)."""

from __future__ import annotations

import pytest

from megatron_rl.tiny import make_tiny_model
from weight_transfer.config import WeightTransferConfig
from weight_transfer.coordinator import WeightTransferCoordinator
from weight_transfer.local_senders import LocalSenders
from weight_transfer.replicas import LLMReplica
from weight_transfer.transports.shared_memory import SharedMemoryReceiver
from wt_helpers import PerturbedWeights, checkpoint, close_llm, hf_logprobs, make_llm, max_diff, perturbed, plan_for, vllm_logprobs


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_update_reaches_two_replicas_over_both_cpu_transports(arch, tmp_path, monkeypatch):
    model = make_tiny_model(arch, size="unit", seed=0)
    plan = plan_for(model, tp=2, bucket_bytes=256 << 10)
    assert plan.senders == [0, 1] and len(plan.buckets) > 2
    llms = [make_llm(model), make_llm(model)]
    replicas = [LLMReplica(llm, f"r{i}") for i, llm in enumerate(llms)]
    try:
        original = hf_logprobs(model, checkpoint(model), tmp_path)
        assert max_diff(vllm_logprobs(llms[0]), original) < 1e-3
        for version, kind, at_finish in [(1, "broadcast", False), (2, "shared_memory", False), (3, "shared_memory", True)]:
            monkeypatch.setattr(SharedMemoryReceiver, "reads_after_send", at_finish)
            config = WeightTransferConfig(transport={"type": kind}, bucket_size_mb=1, timeout_s=60)
            senders = LocalSenders(plan, PerturbedWeights(model))
            try:
                metrics = WeightTransferCoordinator(config, plan, replicas, senders).update(version)
            finally:
                senders.disconnect()
            assert metrics["weight_transfer/retries"] == 0 and metrics["weight_transfer/quarantined"] == 0
            assert metrics["weight_transfer/bytes"] == plan.nbytes
            legs = [metrics[f"weight_transfer/{leg}_seconds"] for leg in ("receive_worker", "receive", "transfer")]
            assert 0 < metrics["weight_transfer/send_seconds"] <= legs[2], metrics
            assert (legs[:2] == [0, 0]) if at_finish else (0 < legs[0] <= legs[1] <= legs[2]), metrics
            window = [metrics[f"weight_transfer/{leg}_seconds"] for leg in ("verify", "finish_worker", "finish", "pause")]
            assert 0 < window[0] <= window[1] <= window[2] <= window[3], metrics
            assert metrics["weight_transfer/load_seconds"] <= window[1], metrics
            expected = hf_logprobs(model, perturbed(model, version), tmp_path)
            assert max_diff(expected, original) > 0.05, "the perturbation must move log-probs measurably"
            for replica in replicas:
                assert replica.serving
                diff = max_diff(vllm_logprobs(replica.llm), expected)
                assert diff < 1e-3, f"{arch} {kind} {replica.name}: vLLM vs transformers log-probs differ by {diff}"
    finally:
        for llm in llms:
            close_llm(llm)
