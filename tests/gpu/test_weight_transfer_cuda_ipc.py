"""cuda_ipc on one GPU: a sender process hands each bucket to the receiver by IPC handle.

Bandwidth for ~1B and ~7B-parameter bf16 tensor sets against the device's D2D copy bandwidth measured in the
same run, both as bytes delivered per second (target >= 50%), and a real vLLM engine updated through the receiver mixin, checked against
transformers' log-probs. Run: python -m pytest tests/gpu/test_weight_transfer_cuda_ipc.py -s
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from weight_transfer.config import WeightTransferConfig
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TensorSpec, TransferPlan
from weight_transfer.session import new_session
from weight_transfer.transports import make_receiver

SIZES = {"1B": (16, 2048, 5632), "7B": (32, 4096, 11008)}  # layers, hidden, intermediate (Llama-shaped)


def _specs(layers: int, hidden: int, inter: int) -> list[TensorSpec]:
    specs = [TensorSpec("model.embed_tokens.weight", (32000, hidden), "bfloat16")]
    for i in range(layers):
        p = f"model.layers.{i}"
        specs += [TensorSpec(f"{p}.self_attn.{n}.weight", (hidden, hidden), "bfloat16") for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        specs += [TensorSpec(f"{p}.mlp.{n}.weight", (inter, hidden), "bfloat16") for n in ("gate_proj", "up_proj")]
        specs.append(TensorSpec(f"{p}.mlp.down_proj.weight", (hidden, inter), "bfloat16"))
    return specs


class GpuWeights:
    """Sender-side weights on CUDA, made once per process (the trainer's exported tensors): they never move,
    so the export has one static key and the sender replays its first pack (as for a trainer whose export
    is views of its parameters, ``parallel.weights.hf_export``)."""

    def __init__(self, specs: list[TensorSpec]):
        self.specs, self.tensors = specs, None
        self.values = {s.name: 0.01 * (i % 7) for i, s in enumerate(specs)}  # each tensor is this one value

    def __call__(self, rank: int, version: int):
        from parallel.weights.hf_export import ExportedTensors

        if self.tensors is None:
            self.tensors = {s.name: torch.full(s.shape, self.values[s.name], dtype=torch.bfloat16, device="cuda")
                            for s in self.specs}
        return ExportedTensors(iter(self.tensors.items()), static_key=lambda: ("GpuWeights", rank))


def d2d_gbps(nbytes: int) -> float:
    """Bytes a device-to-device copy delivers per second (each byte read once and written once)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    torch.cuda.synchronize()
    return nbytes * 5 / (time.perf_counter() - start) / 1e9


def _update(senders, receiver, plan, version: int, dest: dict | None) -> float:
    """Seconds for one version's transfer, as the coordinator's ``transfer_seconds`` counts it: the trainer
    packs, checksums and publishes every bucket; the receiver maps each one and, with ``dest``, copies it
    out (what a replica's load reads). The release that follows is not timed."""
    start = time.perf_counter()
    sent = threading.Thread(target=senders.send, args=(version, False))
    sent.start()
    for bucket, flat in receiver.receive(version, plan.buckets):
        if dest is not None:
            dest[bucket.index].copy_(flat)
    torch.cuda.synchronize()
    sent.join()
    seconds = time.perf_counter() - start
    receiver.release(version)
    senders.release(version)
    return seconds


# The share of a D2D copy is a benchmark's figure (target >= 50% at >= 1 GiB buckets; bench_gpu_transfer.py prints
# whether it is met), printed here and not asserted. Measured with this test on the H200, 16 runs over three machine
# starts (2026-12-02: 6, 2026-12-03: 5, 2026-12-04: 5): 7B 87-93% (median 90%), 1B 40-52% (median 48-49%: the 1B
# target is missed; the update is bound by fixed host costs, the replayed pack kernel alone takes 0.94 ms of ~1.7 ms).
# Those runs timed updates 1-3, mostly update 1 (no graph yet; see the warm-up below). On an H100 (2026-12-06, one
# start) the test as it was printed 1B 53-60% (median 58.5%, 6 runs), while 30 updates after the warm-up, timed
# phase by phase, took 1.713 ms (median) against 1.192 ms for a D2D copy of the same bytes: ~70%. The steady-state
# sampling below on the H200 (2026-12-06, one start, 7 runs): 1B 53-58% (median 56%), 7B 94-96% (median 95%); with
# the receiver waiting for the sender's event on its host (now the code), interleaved with those: 1B 57-64% (median
# 62%). A second start, an H100 (2026-12-07, six runs): 1B 69-74% (median 72.5%), 7B 106%; over both starts the
# 1B median is 64% (57-74%, 13 runs).
@pytest.mark.parametrize("size", ["1B", "7B"])
def test_cuda_ipc_bandwidth_against_device_copy(size):
    """Eleven updates of the set reach the receiver, every bucket checksum-verified; prints the share of a D2D
    copy of the updates after the warm-up."""
    from weight_transfer.local_senders import LocalSenders

    specs = _specs(*SIZES[size])
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=SIZES[size][0]), 1 << 30)
    session = new_session(WeightTransferConfig(transport={"type": "cuda_ipc"}, timeout_s=120), plan, 1)
    weights = GpuWeights(specs)
    senders = LocalSenders(plan, weights, device="cuda")
    senders.connect(session)
    receiver = make_receiver(session, 1, torch.device("cuda"))
    dest = {b.index: torch.empty(b.nbytes, dtype=torch.uint8, device="cuda") for b in plan.buckets}
    try:
        # Warm-up, as every run's first updates: 0 packs and records (and the receiver maps the buffers), 1
        # replays the record launch by launch, 2 captures the replay as a CUDA graph; from 3 on, each update of
        # a run replays that graph. (Until 2026-12-06 updates 1-3 were timed: their median was mostly update 1,
        # without the graph.)
        for v in range(3):
            _update(senders, receiver, plan, v, None)
        handoff = [_update(senders, receiver, plan, v, None) for v in range(3, 8)]
        with_load = [_update(senders, receiver, plan, v, dest) for v in range(8, 11)]
    finally:
        receiver.close()
        senders.disconnect()
    base = d2d_gbps(1 << 30)
    gbps = plan.nbytes / statistics.median(handoff) / 1e9
    loaded = plan.nbytes / statistics.median(with_load) / 1e9
    print(f"\ncuda_ipc {size}: {plan.nbytes / 1e9:.2f} GB, {len(plan.buckets)} buckets; handoff (pack + checksum + "
          f"publish, receiver maps) {gbps:.0f} GB/s = {gbps / base:.0%} of a D2D copy ({base:.0f} GB/s of bytes "
          f"copied); with the receiver's copy-out {loaded:.0f} GB/s = {loaded / base:.0%}")
    for bucket in plan.buckets:  # the last copy-out holds every tensor's bytes where its slot lies
        for slot in bucket.slots:
            got = dest[bucket.index][slot.offset:slot.offset + slot.nbytes].view(torch.bfloat16)
            assert torch.equal(got, torch.full_like(got, weights.values[slot.name])), slot.name


@pytest.mark.parametrize("load", ["reload", "direct"])
def test_cuda_ipc_update_reaches_vllm_on_the_same_gpu(tmp_path, load):
    sys.path.insert(0, str(Path(__file__).parents[1] / "integration" / "weight_transfer"))
    from megatron_rl.tiny import make_tiny_model
    from weight_transfer.coordinator import WeightTransferCoordinator
    from weight_transfer.local_senders import LocalSenders
    from weight_transfer.replicas import LLMReplica
    from wt_helpers import PerturbedWeights, checkpoint, close_llm, hf_logprobs, make_llm, max_diff, perturbed, plan_for, vllm_logprobs

    model = make_tiny_model("qwen3", size="unit", seed=0)
    plan = plan_for(model, tp=1, bucket_bytes=1 << 20)
    llm = make_llm(model)
    senders = LocalSenders(plan, PerturbedWeights(model), device="cuda")
    try:
        config = WeightTransferConfig(transport={"type": "cuda_ipc"}, bucket_size_mb=1, timeout_s=120, load=load)
        replica = LLMReplica(llm, "r0")
        assert replica.call("wt_describe", {"load": "auto"}, 60)[0]["load"] == "direct", "a dense bf16 model on CUDA loads in place"
        coordinator = WeightTransferCoordinator(config, plan, [replica], senders)
        previous = hf_logprobs(model, checkpoint(model), tmp_path)
        for version in (1, 2):  # the second update must move the weights again, not only the first
            metrics = coordinator.update(version)
            expected = hf_logprobs(model, perturbed(model, version), tmp_path)
            diff = max_diff(vllm_logprobs(llm), expected)
            print(f"\ncuda_ipc into vLLM, load={load}, version {version}: {metrics}; log-prob max diff vs transformers {diff:.2e}")
            assert diff < 0.05, f"load={load}: vLLM after update {version} differs from transformers by {diff}"
            assert max_diff(previous, expected) > 2 * diff, "the versions must differ by more than the tolerance"
            previous = expected
    finally:
        senders.disconnect()
        close_llm(llm)


def test_cuda_ipc_from_a_megatron_policy_into_vllm_on_the_same_gpu(tmp_path):
    """The ~1B bf16 MegatronPolicy (trainer process) -> vLLM on the same GPU through the coordinator, by
    ``benchmarks/bench_gpu_transfer.py --transport cuda_ipc``; its table holds GB/s against D2D copies."""
    from test_multi_gpu_transfer import run_transfer_bench

    res = run_transfer_bench(tmp_path, "--transport", "cuda_ipc", "--load", "reload,direct")
    print("\n" + "\n".join(f"{r['bucket_mb']} MiB: {r['gbps']:.0f} GB/s = {r['ratio']:.0%} of D2D, loaded by {r['load']} "
                            f"in {r['load_s'] * 1e3:.0f} ms" for r in res["rows"]))


def test_cuda_ipc_from_a_7b_megatron_model_into_vllm_on_the_same_gpu(tmp_path):
    """The ~7B bf16 megatron model (weights only: with its optimizer it does not fit beside vLLM) -> vLLM on
    the same GPU, ``--trainer model``, at 1 and 4 GiB buckets. The bandwidth is printed, not asserted: it
    measured 45-72% of a D2D copy (median 62%) over twelve rows in three sessions (the benchmark's own target
    line says met or MISSED)."""
    from test_multi_gpu_transfer import run_transfer_bench

    res = run_transfer_bench(tmp_path, "--transport", "cuda_ipc", "--trainer", "model", size="7b", buckets=(1024, 4096))
    print("\n" + "\n".join(f"{r['bucket_mb']} MiB: {r['gbps']:.0f} GB/s = {r['ratio']:.0%} of D2D" for r in res["rows"]))
