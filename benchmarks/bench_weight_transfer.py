"""Weight-transfer benchmark: CPU transports (broadcast over gloo, shared memory, NIXL pull over UCX,
tensorstore deltas in a folder) against a plain memcpy in the same run; the bytes tensorstore_delta writes
and reads when 1%, 5% and 100% of the tensors change; the pause window (generation stopped) of each
transport with a real vLLM CPU engine (``--pause``); then an analytic projection for large MoE layouts
next to published numbers.

``--device cuda`` measures NIXL pulls of GPU memory instead: sender processes pack into registered buffers
on the GPU, this process pulls into registered buffers on the same GPU (UCX between processes of one GPU),
against device-to-device copies of the same buffers in the same run.

    python benchmarks/bench_weight_transfer.py --mb 512 --bucket-mb 64 --senders 2 --pause
    python benchmarks/bench_weight_transfer.py --device cuda --mb 4096 --bucket-mb 256 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch

from weight_transfer.config import WeightTransferConfig
from weight_transfer.layout import TrainerLayout
from weight_transfer.local_senders import LocalSenders
from weight_transfer.plan import TensorSpec, TransferPlan
from weight_transfer.projection import Fleet, Links, project
from weight_transfer.session import new_session
from weight_transfer.transports import make_receiver

TENSOR_MB = 16


class Synthetic:
    """Weights for sender ranks: 16 MiB float32 tensors of random values on ``device``, made once per process.
    Version v gives the second set of values for every tensor when v is odd (``changing``: all of them change
    each version, as a delta transport's worst case), else the first."""

    def __init__(self, mb: int, changing: bool = False, device: str = "cpu"):
        self.mb, self.changing, self.device, self.sets = mb, changing, device, None

    def __call__(self, rank: int, version: int):
        if self.sets is None:
            gen = torch.Generator().manual_seed(0)
            names = _names(self.mb)
            self.sets = [{n: torch.randn(TENSOR_MB << 18, generator=gen).to(self.device) for n in names}
                         for _ in range(1 + self.changing)]
        return self.sets[version % 2 if self.changing else 0].items()


def _names(total_mb: int) -> list[str]:
    return [f"model.layers.{i}.mlp.up_proj.weight" for i in range(total_mb // TENSOR_MB)]


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize(device)


def memcpy_gbps(nbytes: int, repeats: int = 3, device: str = "cpu", bucket_bytes: int | None = None) -> float:
    """Bytes copied per second by ``copy_`` on ``device`` (on a GPU: device-to-device) over ``repeats``
    copies after a warm-up, in ``bucket_bytes`` pieces when given (the transports move buckets)."""
    piece = bucket_bytes or nbytes
    src = [torch.ones(piece, dtype=torch.uint8, device=device) for _ in range(nbytes // piece)]
    dst = [torch.empty_like(t) for t in src]
    for rep in range(repeats + 1):
        if rep == 1:
            _sync(device)
            start = time.perf_counter()
        for d, t in zip(dst, src):
            d.copy_(t)
    _sync(device)
    return piece * len(src) * repeats / (time.perf_counter() - start) / 1e9


def transport_options(kind: str, root: str) -> dict:
    return {"shared_memory": {"type": kind, "dir": "/dev/shm"}, "tensorstore_delta": {"type": kind, "root": root}}.get(
        kind, {"type": kind})


def transport_gbps(kind: str, plan: TransferPlan, mb: int, repeats: int, root: str, device: str = "cpu") -> list[float]:
    """Sender processes send every bucket; this process receives and copies each into place (as a load does).
    Every version changes every tensor (tensorstore_delta writes and reads all of it: its worst case).
    GB/s of each version after the first (which registers buffers and makes transfer handles)."""
    config = WeightTransferConfig(transport=transport_options(kind, root), timeout_s=120)
    session = new_session(config, plan, num_receivers=1)
    senders = LocalSenders(plan, Synthetic(mb, changing=True, device=device), device=device)
    joined = {}
    thread = threading.Thread(target=lambda: joined.update(r=make_receiver(session, 1, torch.device(device))))
    thread.start()
    senders.connect(session)
    thread.join()
    dest = {b.index: torch.empty(b.nbytes, dtype=torch.uint8, device=device) for b in plan.buckets}
    times = []
    try:
        for version in range(repeats + 1):
            start = time.perf_counter()
            sent = threading.Thread(target=senders.send, args=(version, False))
            sent.start()
            for bucket, flat in joined["r"].receive(version, plan.buckets):
                dest[bucket.index].copy_(flat)
            _sync(device)
            sent.join()
            times.append(time.perf_counter() - start)
            senders.release(version)
    finally:
        senders.disconnect()
    return [plan.nbytes / t / 1e9 for t in times[1:]]


DELTA_CASES = (("1% of tensors", 0.01, 1.0), ("5% of tensors", 0.05, 1.0), ("100% of tensors", 1.0, 1.0),
               ("1% of elements of every tensor", 1.0, 0.01))


def delta_bytes(root: str | None, tensors: int = 200, numel: int = 1 << 19, chunk_kb: int = 256) -> float:
    """Bytes tensorstore_delta writes and a replica holding the previous version reads, for bf16 tensors of
    random values when a fraction of the tensors (all their elements) or of every tensor's elements change.
    Sender and receiver in this process; returns the stored fraction of the last case (sparse elements)."""
    from weight_transfer.sender import send_weights
    from weight_transfer.transports import make_receiver as receiver_of, make_sender
    from weight_transfer.transports import tensorstore_delta as tsd

    specs = [TensorSpec(f"model.layers.{i}.mlp.up_proj.weight", (numel,), "bfloat16") for i in range(tensors)]
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=tensors), 64 << 20)
    gen = torch.Generator().manual_seed(0)
    base = {s.name: torch.randn(numel, generator=gen).to(torch.bfloat16) for s in specs}
    print(f"\ntensorstore_delta bytes: {plan.nbytes / 2**20:.0f} MiB of bf16 in {len(plan.buckets)} buckets, "
          f"{chunk_kb} KiB chunks, version 1 written whole, version 2 changed as below")
    ratio = 0.0
    for label, tensor_frac, element_frac in DELTA_CASES:
        folder = tempfile.mkdtemp(prefix="wt-delta-", dir=root)
        tsd._STATES.clear()
        tsd._HELD.clear()
        config = WeightTransferConfig(transport={"type": "tensorstore_delta", "root": folder, "chunk_kb": chunk_kb},
                                      timeout_s=60)
        session = new_session(config, plan, 1)
        changed = dict(base)
        for i, spec in enumerate(specs[:max(1, round(tensor_frac * tensors))]):
            where = torch.rand(numel, generator=gen) < element_frac
            changed[spec.name] = torch.where(where, base[spec.name] * 1.01 + 0.001, base[spec.name])
        seconds = {}
        for version, weights in ((1, base), (2, changed)):
            start = time.perf_counter()
            sender = make_sender(session, 0, torch.device("cpu"))
            send_weights(plan, 0, weights.items(), sender, version, torch.device("cpu"))
            seconds["write"] = time.perf_counter() - start
            receiver = receiver_of(session, 1, torch.device("cpu"))
            start = time.perf_counter()
            for _ in receiver.receive(version, plan.buckets):
                pass
            seconds["read"] = time.perf_counter() - start
        manifest = json.loads(tsd.manifest_path(session, 0, 2).read_text())
        stored = sum(e["stored_bytes"] for e in manifest["buckets"].values())
        ratio = stored / plan.nbytes
        print(f"  {label:31s} written {stored / 2**20:8.2f} MiB = {ratio:7.2%} of the model, read "
              f"{receiver.stats['bytes_read'] / 2**20:8.2f} MiB; write {seconds['write']:.2f} s, read {seconds['read']:.2f} s")
        shutil.rmtree(folder, ignore_errors=True)
    return ratio


class NoisyCheckpoint:
    """Weights for sender ranks: a checkpoint plus seeded noise per version (every tensor changes)."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir

    def __call__(self, rank: int, version: int):
        from safetensors.torch import load_file

        gen = torch.Generator().manual_seed(version)
        for name, tensor in sorted(load_file(str(Path(self.model_dir) / "model.safetensors")).items()):
            yield name, tensor + 0.03 * torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype)


def pause_windows(root: str, updates: int = 3) -> None:
    """Each transport's update of one vLLM CPU engine (tiny qwen3, 2 sender processes): the pause window
    (pause call + finish: verify and load + resume) against the whole update; medians of ``updates``."""
    run = Path(tempfile.mkdtemp(prefix="wt-bench-vllm-"))
    for key, sub in (("VLLM_CACHE_ROOT", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("VLLM_RPC_BASE_PATH", "")):
        os.environ.setdefault(key, str(run / sub))
    from safetensors.torch import load_file
    from vllm import LLM

    from megatron_rl.tiny import make_tiny_model
    from weight_transfer.coordinator import WeightTransferCoordinator
    from weight_transfer.plan import specs_from_tensors
    from weight_transfer.replicas import LLMReplica

    model = make_tiny_model("qwen3", run / "model", size="unit", seed=0)
    specs = specs_from_tensors(load_file(str(Path(model) / "model.safetensors")))
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=2, tp=2), 1 << 20, senders="spread")
    llm = LLM(str(model), dtype="float32", enforce_eager=True, max_model_len=256, seed=0, kv_cache_memory_bytes=1 << 26,
              worker_extension_cls="weight_transfer.vllm_receiver.WeightReceiver")
    replica = LLMReplica(llm, "r0")
    print(f"\npause window, one vLLM CPU engine, tiny qwen3 ({plan.nbytes / 2**20:.1f} MiB, {len(plan.buckets)} buckets, "
          f"2 sender processes; medians of {updates} updates; every tensor changes)")
    version = 0
    try:
        for kind in ("broadcast", "shared_memory", "nixl", "tensorstore_delta"):
            config = WeightTransferConfig(transport=transport_options(kind, root), bucket_size_mb=1, timeout_s=60)
            senders = LocalSenders(plan, NoisyCheckpoint(str(model)))
            coordinator = WeightTransferCoordinator(config, plan, [replica], senders)
            rows = []
            try:
                for _ in range(updates):
                    version += 1
                    rows.append(coordinator.update(version))
            finally:
                senders.disconnect()

            def median(key):
                return sorted(r[f"weight_transfer/{key}"] for r in rows)[len(rows) // 2] * 1e3

            print(f"  {kind:17s} pause {median('pause_seconds'):7.1f} ms (load {median('load_seconds'):6.1f}, "
                  f"verify {median('verify_seconds'):5.1f}) | whole update {median('seconds'):7.1f} ms, "
                  f"transfer {median('transfer_seconds'):7.1f} ms")
    finally:
        llm.llm_engine.engine_core.shutdown()
        shutil.rmtree(run, ignore_errors=True)


def _moe_specs(layers, hidden, heads, kv_heads, head_dim, experts, moe_inter, vocab, dense_layers=0,
               dense_inter=0, shared_inter=0) -> list[TensorSpec]:
    bf = "bfloat16"
    specs = [TensorSpec("model.embed_tokens.weight", (vocab, hidden), bf), TensorSpec("lm_head.weight", (vocab, hidden), bf),
             TensorSpec("model.norm.weight", (hidden,), bf)]
    for i in range(layers):
        p = f"model.layers.{i}"
        specs += [TensorSpec(f"{p}.self_attn.q_proj.weight", (heads * head_dim, hidden), bf),
                  TensorSpec(f"{p}.self_attn.k_proj.weight", (kv_heads * head_dim, hidden), bf),
                  TensorSpec(f"{p}.self_attn.v_proj.weight", (kv_heads * head_dim, hidden), bf),
                  TensorSpec(f"{p}.self_attn.o_proj.weight", (hidden, heads * head_dim), bf),
                  TensorSpec(f"{p}.input_layernorm.weight", (hidden,), bf),
                  TensorSpec(f"{p}.post_attention_layernorm.weight", (hidden,), bf)]
        if i < dense_layers:
            specs += [TensorSpec(f"{p}.mlp.{n}.weight", s, bf) for n, s in
                      (("gate_proj", (dense_inter, hidden)), ("up_proj", (dense_inter, hidden)), ("down_proj", (hidden, dense_inter)))]
            continue
        specs.append(TensorSpec(f"{p}.mlp.gate.weight", (experts, hidden), bf))
        for e in range(experts):
            specs += [TensorSpec(f"{p}.mlp.experts.{e}.{n}.weight", s, bf) for n, s in
                      (("gate_proj", (moe_inter, hidden)), ("up_proj", (moe_inter, hidden)), ("down_proj", (hidden, moe_inter)))]
        if shared_inter:
            specs += [TensorSpec(f"{p}.mlp.shared_experts.{n}.weight", s, bf) for n, s in
                      (("gate_proj", (shared_inter, hidden)), ("up_proj", (shared_inter, hidden)), ("down_proj", (hidden, shared_inter)))]
    return specs


# (model, specs, trainer layout, fleet, published numbers)
# DeepSeek-V3's MLA projections are approximated by GQA-shaped q/k/v/o of the same parameter count.
CASES = [
    ("Qwen3-30B-A3B", lambda: _moe_specs(48, 2048, 32, 4, 128, 128, 768, 151936),
     TrainerLayout(num_layers=48, tp=2, dp=8, ep=8, num_experts=128), Fleet(2, 2, inference_tp=4),
     "Miles 2 nodes: NCCL 2.67 s, RDMA 2.16 s; NeMo-RL reshard 0.74-1.00 s"),
    ("Qwen3-235B-A22B", lambda: _moe_specs(94, 4096, 64, 4, 128, 128, 1536, 151936),
     TrainerLayout(num_layers=94, tp=2, pp=2, dp=4, ep=4, num_experts=128), Fleet(2, 2, inference_tp=8),
     "SkyRL 2+2 nodes: broadcast 64.72 s, NIXL pull 3.54 s"),
    ("Qwen3-235B-A22B", lambda: _moe_specs(94, 4096, 64, 4, 128, 128, 1536, 151936),
     TrainerLayout(num_layers=94, tp=4, pp=4, dp=4, ep=4, num_experts=128), Fleet(8, 8, inference_tp=8),
     "Miles 8 nodes: NCCL 10.75 s, RDMA 3.16 s; veRL 8+2 nodes 11.4-14.9 s"),
    ("DeepSeek-V3", lambda: _moe_specs(61, 7168, 128, 128, 144, 256, 2048, 129280, 3, 18432, 2048),
     TrainerLayout(num_layers=61, pp=16, dp=16, ep=16, num_experts=256), Fleet(32, 32, inference_tp=32),
     "NeMo-RL PP16xEP16 -> TP32xDP8: 2.39-2.83 s; 36 nodes NCCL 14.21 s, NIXL 9.25 s"),
    ("Kimi-K2 (1T)", lambda: _moe_specs(61, 7168, 64, 64, 144, 384, 2048, 163840, 1, 18432, 2048),
     TrainerLayout(num_layers=61, pp=16, dp=16, ep=16, num_experts=384), Fleet(32, 32, inference_tp=16),
     "SGLang/Miles RDMA P2P 7.2 s vs NCCL 53 s; checkpoint-engine 16 s on 256 GPUs"),
]


def projections(links: Links, bucket_mb: int, storage_gbps: float, delta_ratio: float) -> None:
    """``sharded`` is what nixl's pull reaches once each engine GPU pulls only its shard (today every worker
    pulls every bucket, as ``broadcast`` counts); ``delta`` is tensorstore_delta with every inference GPU
    reading ``delta_ratio`` of the model from storage at ``storage_gbps`` per node."""
    print(f"\nprojection (bandwidth-bound lower bound; inter-node {links.inter_node_gbps} GB/s, "
          f"NVLink {links.intra_node_gbps} GB/s per node; delta: {delta_ratio:.2%} of the bytes, storage "
          f"{storage_gbps} GB/s per node, every GPU reads it)")
    for name, specs, layout, fleet, published in CASES:
        tensors = specs()
        start = time.process_time()
        plan = TransferPlan.build(tensors, layout, bucket_mb << 20)
        assert TransferPlan.from_json(plan.to_json()).fingerprint == plan.fingerprint
        plan_s = time.process_time() - start
        p = project(plan, fleet, links)
        delta_s = plan.nbytes * delta_ratio * fleet.gpus_per_node / (storage_gbps * 1e9)
        print(f"{name:16s} {p['bytes'] / 1e9:7.1f} GB, {int(p['senders']):4d} sender ranks, "
              f"{fleet.trainer_nodes}+{fleet.inference_nodes} nodes: broadcast {p['broadcast_s']:.2f} s, "
              f"sharded {p['sharded_s']:.2f} s, delta {delta_s:.2f} s | published: {published} | plan of "
              f"{len(plan.entries)} tensors built + JSON round trip in {plan_s:.1f} s of CPU")


def _spread(values: list[float]) -> str:
    values = sorted(values)
    return f"median {values[len(values) // 2]:6.2f} GB/s (min {values[0]:.2f}, max {values[-1]:.2f}, n={len(values)})"


def cpu_transports(plan: TransferPlan, args) -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (numbers below share the machine)")
    base = memcpy_gbps(plan.nbytes)
    print(f"CPU: {plan.nbytes / 2**20:.0f} MiB in {len(plan.buckets)} buckets from {len(plan.senders)} sender "
          f"processes to 1 receiver; memcpy {base:.2f} GB/s")
    root = tempfile.mkdtemp(prefix="wt-bench-", dir=args.root)
    try:
        for kind in ("broadcast", "shared_memory", "nixl", "tensorstore_delta"):
            gbps = max(transport_gbps(kind, plan, args.mb, args.repeats, root))
            print(f"  {kind:17s} {gbps:6.2f} GB/s  = {gbps / base:.0%} of memcpy")
        print(f"load average {os.getloadavg()[0]:.1f}")
        ratio = delta_bytes(args.root)
        if args.pause:
            pause_windows(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    projections(Links(args.inter_node_gbps, args.intra_node_gbps), args.bucket_mb, args.storage_gbps, ratio)
    print(f"({len(CASES)} plans built and projected in {time.perf_counter() - start:.1f} s)")


def gpu_pulls(plan: TransferPlan, args) -> None:
    """NIXL between processes of one GPU: every version is packed by the senders (D2D into registered
    buffers), pulled by this process (UCX, GPU to GPU) and copied into place, so the transport moves each
    byte three times where the baseline copies it once."""
    print(f"{torch.cuda.get_device_name()}: {plan.nbytes / 2**20:.0f} MiB in {len(plan.buckets)} buckets from "
          f"{len(plan.senders)} sender processes to 1 receiver process, all on GPU 0")
    copies = [memcpy_gbps(plan.nbytes, 1, "cuda", args.bucket_mb << 20) for _ in range(args.repeats)]
    print(f"  D2D copy (bucket-sized)    {_spread(copies)}")
    pulls = transport_gbps("nixl", plan, args.mb, args.repeats, tempfile.gettempdir(), "cuda")
    print(f"  nixl pack + pull + place   {_spread(pulls)} = {sorted(pulls)[len(pulls) // 2] / sorted(copies)[len(copies) // 2]:.0%} "
          "of D2D")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="model size in MiB")
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--senders", type=int, default=2, help="sender ranks (TP ranks of one stage)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inter-node-gbps", type=float, default=400.0)
    parser.add_argument("--intra-node-gbps", type=float, default=370.0)
    parser.add_argument("--root", default=None, help="folder for tensorstore_delta (default: the temp folder)")
    parser.add_argument("--pause", action="store_true", help="pause window per transport with a vLLM CPU engine")
    parser.add_argument("--storage-gbps", type=float, default=10.0,
                        help="shared storage read bandwidth per inference node, for the delta projection")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: NIXL pulls of GPU memory between processes of one GPU against D2D copies")
    args = parser.parse_args()
    specs = [TensorSpec(n, (TENSOR_MB << 18,), "float32") for n in _names(args.mb)]
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=len(specs), tp=args.senders), args.bucket_mb << 20,
                              senders="spread")  # Synthetic yields every tensor on every rank
    if args.device == "cuda":
        gpu_pulls(plan, args)
    else:
        cpu_transports(plan, args)


if __name__ == "__main__":
    main()
