"""Weight transfer on GPUs through the real protocol: megatron trainer -> real vLLM engine.

Trainer side: one spawned process holds a ``MegatronPolicy`` (TP=1, bf16) of a Qwen3 model with ~1B
(16 x 2048, GQA 16/4, 0.86B, 1.7 GB) or ~7B (32 x 4096, MHA, 6.7B, 13.5 GB) parameters, exports through
``iter_hf_weights`` and sends with ``send_weights``. Receiver side: ``vllm.LLM`` (enforce_eager, bf16) with
the ``WeightReceiver`` extension, driven by ``WeightTransferCoordinator`` through ``collective_rpc``
(connect, receive, verify bucket checksums, load by ``--load``: vLLM's ``reload_weights`` or the model's own
``load_weights`` in place). Transports:

- ``--transport broadcast`` (default): trainer on GPU 0, vLLM on GPU 1, NCCL. Baseline: the same bytes in
  the same message sizes broadcast bare (two processes, torch.distributed NCCL, cuda events, median).
- ``--transport cuda_ipc``: trainer and vLLM on GPU 0. Baseline: device-to-device copies of the same
  message sizes (bytes delivered per second). A 7B policy with its optimizer and a vLLM engine do not fit
  on one H200 together: ``--trainer model`` holds the megatron model's weights alone (same load and
  export code) and makes ``--sizes 7b`` possible there.

After the updates vLLM's prompt log-probs must match megatron's and transformers' on the new (perturbed)
weights within bf16 tolerance.

    export PYTHONPATH=$PWD:/tmp/site    # after .ci/gpu-install.sh /tmp/pieces /tmp/site (README: GPUs)
    python benchmarks/bench_gpu_transfer.py                               # 1b and 7b, 2 GPUs, NCCL
    python benchmarks/bench_gpu_transfer.py --sizes 1b                    # the small model only
    python benchmarks/bench_gpu_transfer.py --transport cuda_ipc          # one GPU, 1b
    python benchmarks/bench_gpu_transfer.py --transport cuda_ipc --sizes 1b,7b --trainer model
    python benchmarks/bench_gpu_transfer.py --transport cuda_ipc --load reload,direct   # both load paths
    python benchmarks/bench_gpu_transfer.py --dry-run                     # CPU: tiny model, gloo, vLLM on CPU

``--before-send`` says what the trainer does right before each update: ``idle`` (updates back to back: the
trainer process waits out the previous update's pause window, ~25 ms) or ``forward`` (a log-prob forward
pass on the fixed prompt, as the RL loop's update follows the trainer's own step). On the H200 every host
step of a 1B send took 2-3 times as long after a 25 ms idle gap (no vLLM engine; a D2D copy after the same
gap: 0.85 against 0.83 ms): idle rows reached 45-59% of D2D (median 50.5%), forward rows 55-62% (55.5%).

GB = 1e9 bytes. "transfer s" is the coordinator's wall time of one update's transfer (senders'
export + pack + checksum + send, concurrently with the replica's receive RPC), median of --reps.
"""

from __future__ import annotations

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast must stay off on the H200 machines

import argparse
import json
import multiprocessing as mp
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO, REPO / "tests" / "integration" / "parallel"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

MiB = 1 << 20
BUCKETS_MB = (64, 256, 1024, 4096)
SHAPES = {  # layers, hidden, heads, kv heads, ffn, vocab
    "1b": (16, 2048, 16, 4, 5632, 32768),
    "7b": (32, 4096, 32, 32, 11008, 32768),
    "tiny": (2, 128, 4, 2, 256, 2048),  # head_dim 32: vLLM's CPU attention needs >= 32
}
# The fixed prompt (same tokens as the CPU weight-transfer tests).
TOKENS = [[5, 17, 300, 42, 7, 999, 1234, 64, 88, 2000, 3, 11, 512, 77, 1500, 9],
          [101, 202, 303, 404, 505, 606, 707, 808, 909, 1010, 1111, 1212]]
# vLLM (bf16, its kernels) vs megatron (bf16, local spec + SDPA) or transformers (bf16) on the same weights, per
# prompt token, nats.
LOGPROB_TOL_MAX, LOGPROB_TOL_MEAN = 0.3, 0.05
# ... or, where larger, this multiple of the two engines' difference on the checkpoint both loaded from disk
# (no transfer involved): deeper random models drift further in bf16 (7B: mean 0.055 after the update).
FLOOR_FACTOR = 1.5
RECEIVER = "weight_transfer.vllm_receiver.WeightReceiver"
# The update's legs as the coordinator times them (``weight_transfer.coordinator.LEGS``; medians kept in the
# JSON rows, with the whole update's and the pause window's): the trainer's send call as the coordinator
# sees it (``sender s`` is the trainer's own time inside it), vLLM's receive call and the time the worker
# spent inside it (the rest is collective_rpc's own; cuda_ipc has no receive call: the worker stages the
# mapped buckets at finish), then the pause window's: the pause call, the finish call, the worker's time
# inside it, and its checksum pass.
INIT_STD, UPDATE_STD = 0.02, 0.01
BEFORE_SEND = ("idle", "forward")  # --before-send modes (module docstring)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------- model files

def write_config(out: Path, shape: tuple, dtype: str) -> None:
    """config.json of a Qwen3 of ``shape`` plus the tiny kit's tokenizer (no weights yet)."""
    from transformers import Qwen3Config

    from megatron_rl.tiny import make_tiny_model

    layers, hidden, heads, kv, ffn, vocab = shape
    tiny = Path(make_tiny_model("qwen3", size="unit", seed=0))
    out.mkdir(parents=True, exist_ok=True)
    for f in tiny.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors", "tiny_model.json", "generation_config.json"):
            shutil.copy(f, out / f.name)
    tiny_vocab = json.loads((tiny / "config.json").read_text())["vocab_size"]
    Qwen3Config(vocab_size=max(vocab, tiny_vocab), hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=ffn, head_dim=hidden // heads,
                max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-6, eos_token_id=2,
                pad_token_id=0, bos_token_id=None, torch_dtype=dtype,
                architectures=["Qwen3ForCausalLM"]).save_pretrained(str(out))


def write_random_weights(hf_dir: Path, dtype, device) -> int:
    """Random weights (std INIT_STD, norms 1) for the config in ``hf_dir``, made on ``device``; returns bytes."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(hf_dir))
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in AutoModelForCausalLM.from_config(config).state_dict().items()}
    gen = torch.Generator(device=device).manual_seed(0)
    tensors = {}
    for name, shp in shapes.items():
        if name.endswith("norm.weight"):
            t = torch.ones(shp, dtype=dtype, device=device)
        else:
            t = torch.randn(shp, generator=gen, device=device, dtype=torch.float32).mul_(INIT_STD).to(dtype)
        tensors[name] = t.cpu()
    save_file(tensors, str(hf_dir / "model.safetensors"))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def safetensors_specs(path: Path):
    """TensorSpecs from a safetensors header (no tensor is read)."""
    from weight_transfer.plan import TensorSpec

    names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return [TensorSpec(n, tuple(v["shape"]), names[v["dtype"]]) for n, v in header.items() if n != "__metadata__"]


def build_plan(hf_dir: Path, bucket_bytes: int):
    from weight_transfer.layout import TrainerLayout
    from weight_transfer.plan import TransferPlan

    layers = json.loads((hf_dir / "config.json").read_text())["num_hidden_layers"]
    return TransferPlan.build(safetensors_specs(hf_dir / "model.safetensors"), TrainerLayout(num_layers=layers), bucket_bytes)


# ------------------------------------------------------------------------------------------- bare broadcast

def _bare_rank(rank: int, port: int, gpu: str | None, messages: dict, reps: int, queue) -> None:
    """Rank ``rank`` of a bare 2-process broadcast: per bucket size, the plan's buckets as messages."""
    try:
        if gpu is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        import torch
        import torch.distributed as dist

        cuda = gpu is not None
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2)
        buf = torch.empty(max(max(m) for m in messages.values()), dtype=torch.uint8, device=device)
        flag = torch.zeros(1, device=device)
        out = {}
        for mb, sizes in messages.items():
            times = []
            for rep in range(reps + 1):
                dist.all_reduce(flag)
                if cuda:
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                t0 = time.perf_counter()
                for n in sizes:
                    dist.broadcast(buf[:n], src=0)
                if cuda:
                    end.record()
                    torch.cuda.synchronize()
                    seconds = start.elapsed_time(end) / 1e3
                else:
                    seconds = time.perf_counter() - t0
                slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if rep:  # the first is warm-up (communicator set-up, first use of the buffer)
                    times.append(slowest.item())
            out[mb] = statistics.median(times)
        dist.destroy_process_group()
        if rank == 0:
            queue.put(("ok", out))
    except BaseException:
        queue.put(("error", f"bare rank {rank}: {traceback.format_exc()}"))
        raise


def bare_broadcast(messages: dict, reps: int, cuda: bool) -> dict:
    """{bucket MiB: median seconds} of broadcasting ``messages[mb]`` (byte sizes) GPU0 -> GPU1."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_bare_rank, args=(r, port, str(r) if cuda else None, messages, reps, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    status, value = queue.get(timeout=600)
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    if status != "ok":
        raise RuntimeError(value)
    return value


def _copy_rank(messages: dict, reps: int, queue) -> None:
    """Device-to-device copies of each bucket size's messages on GPU 0 (the cuda_ipc baseline)."""
    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        import torch

        size = max(max(m) for m in messages.values())
        src = torch.empty(size, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        out = {}
        for mb, sizes in messages.items():
            times = []
            for rep in range(reps + 1):
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for n in sizes:
                    dst[:n].copy_(src[:n])
                end.record()
                torch.cuda.synchronize()
                if rep:
                    times.append(start.elapsed_time(end) / 1e3)
            out[mb] = statistics.median(times)
        queue.put(("ok", out))
    except BaseException:
        queue.put(("error", f"copy baseline: {traceback.format_exc()}"))
        raise


def bare_copy(messages: dict, reps: int) -> dict:
    """{bucket MiB: median seconds} of copying ``messages[mb]`` (byte sizes) within GPU 0."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_copy_rank, args=(messages, reps, queue))
    proc.start()
    status, value = queue.get(timeout=600)
    proc.join(60)
    if status != "ok":
        raise RuntimeError(value)
    return value


# ------------------------------------------------------------------------------------------------- trainer

def _trainer(conn, cuda: bool) -> None:
    """The trainer process: GPU 0 only; answers commands from the parent over ``conn``."""
    if cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    import torch

    state = {"transport": None, "plan": None, "policy": None}
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    while True:
        command, *args = conn.recv()
        try:
            if command == "write":
                start = time.perf_counter()
                nbytes = write_random_weights(Path(args[0]), dtype, device)
                conn.send(("ok", {"bytes": nbytes, "seconds": time.perf_counter() - start}))
            elif command == "build":
                conn.send(("ok", _build_policy(state, Path(args[0]), cuda, device, args[1])))
            elif command == "connect":
                from weight_transfer.plan import TransferPlan
                from weight_transfer.transports import make_sender

                if state["transport"] is not None:
                    state["transport"].close()
                state["plan"] = TransferPlan.from_json(args[0])
                state["transport"] = make_sender(args[1], 0, device)
                conn.send(("ok", None))
            elif command == "forward":
                state["policy"].compute_logprobs(state["batch"])
                if cuda:
                    torch.cuda.synchronize()
                conn.send(("ok", None))
            elif command == "send":
                from weight_transfer.sender import send_weights

                version, digests = args
                start = time.perf_counter()
                # as the RL loop's trainer does (megatron_rl/schedules/weight_sync.py), no device sync after it:
                # reading back the checksums waited for the packing, and finish() for the transport's sends
                out = send_weights(state["plan"], 0, state["policy"].export_weights(row_blocks=True), state["transport"], version,
                                   device, digests)
                out["sender_seconds"] = time.perf_counter() - start
                conn.send(("ok", out))
            elif command == "release":
                state["transport"].release(args[0])
                conn.send(("ok", None))
            elif command == "disconnect":
                if state["transport"] is not None:
                    state["transport"].close()
                state["transport"] = None
                conn.send(("ok", None))
            else:
                conn.send(("ok", None))
                return
        except Exception:
            conn.send(("error", traceback.format_exc(limit=6)))


class MegatronWeights:
    """``--trainer model``: the megatron-core model alone (weights, no gradients or optimizer), loaded and
    exported through the same code as ``MegatronPolicy``. A 7B policy with its optimizer (~120 GB) does not
    fit on one H200 beside a vLLM engine; its weights (13.5 GB) do, and a transfer reads only those."""

    def __init__(self, hf_dir: Path, cfg, init_method: str):
        from parallel import cpu_compat

        cpu_compat.enable()  # before megatron is imported, as MegatronPolicy does
        from parallel.groups import init_distributed
        from parallel.provider import load_model

        self.cfg = cfg
        self.pgs = init_distributed(cfg.parallel, 0, 1, init_method)
        self.model = load_model(hf_dir, cfg, self.pgs).requires_grad_(False)
        self._export = None

    def compute_logprobs(self, batch):
        from parallel.logprob_pass import compute_logprobs

        return compute_logprobs(self.model, batch, self.cfg.max_tokens_per_micro_batch, self.pgs)

    def export_weights(self, row_blocks: bool = False):
        from parallel.weights.hf_export import HFExport

        self._export = self._export or HFExport(self.model, self.pgs)
        return self._export.tensors(row_blocks)


def _build_policy(state: dict, hf_dir: Path, cuda: bool, device, trainer: str = "policy") -> dict:
    """The trainer's model from the checkpoint (a ``MegatronPolicy``, or with ``trainer="model"`` the
    megatron model alone), then one stand-in update (noise on every matrix): the weights the transfers
    carry. Returns the log-probs of TOKENS, megatron's and transformers', on the checkpoint and on those
    weights (transformers' from the exported HF tensors, loaded into the HF model)."""
    import torch

    from megatron_rl.algorithms.config import AlgorithmConfig
    from parallel.config import TrainerConfig
    from parallel.policy import MegatronPolicy
    from parallel_ranks import batch_of

    start = time.perf_counter()
    cfg = TrainerConfig(dtype="bfloat16" if cuda else "float32", max_tokens_per_micro_batch=4096)
    init_method = f"tcp://127.0.0.1:{free_port()}"
    if trainer == "model":
        policy = MegatronWeights(hf_dir, cfg, init_method)
    else:
        policy = MegatronPolicy(hf_dir, cfg, AlgorithmConfig(), 0, 1, init_method)
    batch = batch_of(TOKENS, prompt_len=1)
    loaded = policy.compute_logprobs(batch)[0]  # the checkpoint's weights, as vLLM loads them from disk
    hf_dtype = torch.bfloat16 if cuda else torch.float32
    hf_loaded = transformers_logprobs(hf_dir, device, hf_dtype)
    gen = torch.Generator(device=device).manual_seed(1)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32).mul_(UPDATE_STD).to(p.dtype))
    logp = policy.compute_logprobs(batch)[0]
    state["policy"], state["batch"] = policy, batch
    rows = [logp[b, 1:len(t)].float().tolist() for b, t in enumerate(TOKENS)]
    loaded_rows = [loaded[b, 1:len(t)].float().tolist() for b, t in enumerate(TOKENS)]
    hf_updated = transformers_logprobs(hf_dir, device, hf_dtype, dict(policy.export_weights()))
    return {"references": {"megatron": {"updated": rows, "loaded": loaded_rows},
                           "transformers": {"updated": hf_updated, "loaded": hf_loaded}},
            "seconds": time.perf_counter() - start, "params": sum(p.numel() for p in policy.model.parameters())}


def transformers_logprobs(hf_dir: Path, device, dtype, weights: dict | None = None) -> list[list[float]]:
    """Transformers' log-probs of TOKENS with the checkpoint in ``hf_dir``, or with ``weights`` (every HF
    tensor of it, by name) in its place; the model is freed before returning (vLLM sizes its cache later)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype).to(device).eval()
    if weights is not None:
        model.load_state_dict(weights, strict=True)
    rows = []
    with torch.no_grad():
        for t in TOKENS:
            ids = torch.tensor([t], device=device)
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            rows.append(logp.gather(-1, ids[0, 1:, None])[:, 0].tolist())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


class TrainerSenders:
    """The coordinator's ``Senders``: the one trainer process (rank 0 sends every bucket)."""

    def __init__(self, cuda: bool):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_trainer, args=(child, cuda), daemon=True, name="trainer")
        self.proc.start()
        self.plan = None
        self.last_sender_seconds = []
        self.last_replayed = False

    def post(self, *command) -> None:
        self.conn.send(command)

    def result(self, timeout: float = 900):
        if not self.conn.poll(timeout):
            raise TimeoutError(f"trainer process gave no answer in {timeout} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"trainer: {value}")
        return value

    def call(self, *command, timeout: float = 900):
        self.post(*command)
        return self.result(timeout)

    # Senders protocol
    def endpoints(self, ranks: list[int]) -> dict[int, tuple[str, int]]:
        from weight_transfer.session import local_endpoints

        return local_endpoints(ranks)

    def connect(self, session: dict) -> None:
        self.call("connect", self.plan.to_json(), session)

    def send(self, version: int, digests: bool) -> dict:
        out = self.call("send", version, digests)
        self.last_sender_seconds.append(out.pop("sender_seconds"))
        self.last_replayed = out.pop("replayed")
        return out

    def release(self, version: int) -> None:
        self.call("release", version)

    def disconnect(self) -> None:
        self.call("disconnect")

    def shutdown(self) -> None:
        try:
            self.call("close", timeout=30)
        except Exception:
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


# ---------------------------------------------------------------------------------------------------- vLLM

def make_llm(hf_dir: Path, cuda: bool, gpu_memory_utilization: float):
    from vllm import LLM

    extra = dict(dtype="bfloat16", gpu_memory_utilization=gpu_memory_utilization) if cuda else \
        dict(dtype="float32", kv_cache_memory_bytes=1 << 26)
    return LLM(str(hf_dir), enforce_eager=True, max_model_len=256, seed=0, worker_extension_cls=RECEIVER, **extra)


def vllm_logprobs(llm) -> list[list[float]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=t) for t in TOKENS], params, use_tqdm=False)
    return [[lp[tok].logprob for lp, tok in zip(o.prompt_logprobs[1:], t[1:])] for o, t in zip(outs, TOKENS)]


def logprob_diff(a: list[list[float]], b: list[list[float]]) -> tuple[float, float]:
    diffs = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return max(diffs), sum(diffs) / len(diffs)


# ------------------------------------------------------------------------------------------------ one size

def run_size(size: str, args, cuda: bool, work: Path) -> dict:
    from weight_transfer.replicas import LLMReplica

    t_size = time.perf_counter()
    hf_dir = work / size
    write_config(hf_dir, SHAPES[size], "bfloat16" if cuda else "float32")
    trainer = TrainerSenders(cuda)
    llm = None
    try:
        wrote = trainer.call("write", str(hf_dir))
        print(f"[{size}] random checkpoint {wrote['bytes'] / 1e9:.2f} GB written in {wrote['seconds']:.1f} s", flush=True)
        plans = {mb: build_plan(hf_dir, mb * MiB) for mb in args.buckets}
        messages = {mb: [b.nbytes for b in plan.buckets] for mb, plan in plans.items()}
        if args.transport == "cuda_ipc":
            bare = bare_copy(messages, args.bare_reps)
        else:
            bare = bare_broadcast(messages, args.bare_reps, cuda)
        print(f"[{size}] baseline ({BASELINE[args.transport]}) medians (s): {bare}", flush=True)
        trainer.post("build", str(hf_dir), args.trainer)  # with broadcast, megatron builds on GPU 0 while vLLM starts on GPU 1
        # On one GPU vLLM sizes its cache from the memory free while it profiles: the trainer settles first.
        built = trainer.result() if args.transport == "cuda_ipc" else None
        t0 = time.perf_counter()
        llm = make_llm(hf_dir, cuda, args.gpu_memory_utilization)
        print(f"[{size}] vLLM engine up in {time.perf_counter() - t0:.1f} s", flush=True)
        built = built or trainer.result()
        what = "MegatronPolicy" if args.trainer == "policy" else "megatron model (weights only)"
        print(f"[{size}] {what} {built['params'] / 1e9:.2f}B params built+updated in {built['seconds']:.1f} s", flush=True)
        before = vllm_logprobs(llm)
        replica = LLMReplica(llm, "vllm")
        rows, logprobs = [], {}
        for n, load in enumerate(args.load):
            if n:  # back to the checkpoint (vLLM reads it from disk), so this mode's own updates must move the weights
                llm.collective_rpc("reload_weights")
            how = replica.call("wt_describe", {"load": load}, 60)[0]
            if how["load_error"]:
                raise SystemExit(f"--load {load}: {how['load_error']}")
            for before_send, mb in ((b, mb) for b in args.before_send for mb in args.buckets):
                rows.append(run_bucket_size(size, mb, plans[mb], bare[mb], load, how["load"], before_send, args, replica,
                                            trainer, first_version=len(rows) * 100 + 1))
                r = rows[-1]
                received = (f"receive {r['receive_s'] * 1e3:.2f} ms (worker inside it {r['receive_worker_s'] * 1e3:.2f})"
                            if r["receive_s"] else "received at finish")
                print(format_row(r) + f"  legs: send {r['send_s'] * 1e3:.2f} ms (trainer inside it {r['sender_s'] * 1e3:.2f}), "
                      f"{received}; whole update {r['update_s'] * 1e3:.2f} ms, pause {r['pause_s'] * 1e3:.2f} ms (pause call "
                      f"{r['pause_call_s'] * 1e3:.2f}, finish call {r['finish_s'] * 1e3:.2f}, worker inside it "
                      f"{r['finish_worker_s'] * 1e3:.2f}: checksums {r['verify_s'] * 1e3:.2f}, load {r['load_s'] * 1e3:.2f}); "
                      f"{r['replayed']}/{args.reps} sends replayed the recorded pack", flush=True)
            assert replica.serving
            logprobs[load] = check_logprobs(size, load, before, vllm_logprobs(llm), built["references"])
        return dict(rows=rows, logprobs=logprobs, seconds=time.perf_counter() - t_size)
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        trainer.shutdown()


def run_bucket_size(size: str, mb: int, plan, bare_s: float, load: str, loads_by: str, before: str, args, replica,
                    trainer, first_version: int) -> dict:
    """One table row: ``--reps`` timed updates (after a warm-up) at ``mb`` MiB buckets, loaded by ``load``,
    each after ``before`` (``--before-send``)."""
    from weight_transfer.config import WeightTransferConfig
    from weight_transfer.coordinator import LEGS, WeightTransferCoordinator

    trainer.plan = plan
    config = WeightTransferConfig(transport={"type": args.transport}, bucket_size_mb=mb, timeout_s=args.timeout, load=load)
    coordinator = WeightTransferCoordinator(config, plan, [replica], trainer)
    transfer, loaded, sender, replayed, legs = [], [], [], [], {leg: [] for leg in LEGS + ("update", "pause")}
    for i in range(args.reps + 1):
        if before == "forward":
            trainer.call("forward")
        metrics = coordinator.update(first_version + i)
        if metrics["weight_transfer/retries"] or metrics["weight_transfer/quarantined"]:
            raise RuntimeError(f"[{size}] {mb} MiB: update needed retries or quarantined: {metrics}")
        if i:  # the first update of a session sets up the NCCL communicators
            transfer.append(metrics["weight_transfer/transfer_seconds"])
            loaded.append(metrics["weight_transfer/load_seconds"])
            sender.append(trainer.last_sender_seconds[-1])
            replayed.append(trainer.last_replayed)
            for leg, values in legs.items():
                values.append(metrics["weight_transfer/seconds" if leg == "update" else f"weight_transfer/{leg}_seconds"])
    trainer.disconnect()
    replica.call("wt_close_transport", {}, 60)
    seconds = statistics.median(transfer)
    row = dict(size=size, bucket_mb=mb, buckets=len(plan.buckets), bytes=plan.nbytes, transfer_s=seconds,
               sender_s=statistics.median(sender), load=loads_by, load_s=statistics.median(loaded), before=before,
               gbps=plan.nbytes / seconds / 1e9, bare_s=bare_s, bare_gbps=plan.nbytes / bare_s / 1e9,
               replayed=sum(replayed))
    row["ratio"] = row["gbps"] / row["bare_gbps"]
    row.update({f"{leg}_s": statistics.median(values) for leg, values in legs.items()})
    return row


def check_logprobs(size: str, load: str, before: list, after: list, references: dict) -> dict:
    """vLLM's log-probs ``after`` the updates loaded by ``load`` against each reference engine's (megatron,
    transformers) on the updated weights; the tolerance grows with the two engines' difference on the
    checkpoint both loaded from disk (``before``), and the update must move vLLM's log-probs measurably."""
    result = {}
    for engine, ref in references.items():
        moved = logprob_diff(before, ref["updated"])
        floor = logprob_diff(before, ref["loaded"])
        diff = logprob_diff(after, ref["updated"])
        tol_max, tol_mean = max(LOGPROB_TOL_MAX, FLOOR_FACTOR * floor[0]), max(LOGPROB_TOL_MEAN, FLOOR_FACTOR * floor[1])
        result[engine] = dict(max=diff[0], mean=diff[1], before_max=moved[0], before_mean=moved[1], floor_max=floor[0],
                              floor_mean=floor[1], tol_max=tol_max, tol_mean=tol_mean,
                              ok=diff[0] <= tol_max and diff[1] <= tol_mean and moved[0] > 2 * diff[0])
        print(f"[{size}] load={load}: vLLM vs {engine} log-probs after the updates: max {diff[0]:.4f} mean "
              f"{diff[1]:.4f} nats; on the checkpoint both loaded from disk: max {floor[0]:.4f} mean {floor[1]:.4f} "
              f"(tolerance max {tol_max:.3f}, mean {tol_mean:.3f}); before the update: max {moved[0]:.4f} mean "
              f"{moved[1]:.4f} -> {'OK' if result[engine]['ok'] else 'FAIL'}", flush=True)
    result["ok"] = all(r["ok"] for r in result.values())
    return result


# ------------------------------------------------------------------------------------------------- output

BASELINE = {"broadcast": "bare broadcast, NCCL GPU0 -> GPU1 (gloo in --dry-run)", "cuda_ipc": "device-to-device copy on GPU 0"}
HEADER = ("| model | bucket | buckets | bytes | before send | transfer s | sender s | GB/s | baseline s | baseline GB/s | ratio "
          "| vLLM load | load s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def format_row(r: dict) -> str:
    return (f"| {r['size']} | {r['bucket_mb']} MiB | {r['buckets']} | {r['bytes'] / 1e9:.3f} GB | {r['before']} | {r['transfer_s']:.4f} "
            f"| {r['sender_s']:.4f} | {r['gbps']:.1f} | {r['bare_s']:.4f} | {r['bare_gbps']:.1f} | {r['ratio']:.0%} "
            f"| {r['load']} | {r['load_s']:.3f} |")


def print_table(results: dict, target: float, transport: str) -> bool:
    print(f"\ntransport {transport}; baseline: {BASELINE[transport]}\n" + HEADER)
    ok = True
    for res in results.values():
        for r in res["rows"]:
            print(format_row(r))
    print(f"\ntarget: >= {target:.0%} of the baseline at >= 1 GiB buckets; vLLM log-probs within "
          f"max {LOGPROB_TOL_MAX} / mean {LOGPROB_TOL_MEAN} nats of megatron's and transformers' (bf16), or {FLOOR_FACTOR}x "
          "their difference on the checkpoint both loaded from disk where that is larger")
    for size, res in results.items():
        big = [r for r in res["rows"] if r["bucket_mb"] >= 1024]
        hit = all(r["ratio"] >= target for r in big)
        ratios = ", ".join("%d MiB %s %.0f%%" % (r["bucket_mb"], r["before"], 100 * r["ratio"]) for r in big) or "no bucket >= 1 GiB"
        print(f"{size}: bandwidth target {'met' if hit else 'MISSED'} ({ratios}); "
              f"log-probs {', '.join(f'load={k} ' + ('OK' if v['ok'] else 'FAIL') for k, v in res['logprobs'].items())}; "
              f"{res['seconds']:.0f} s")
        ok = ok and all(v["ok"] for v in res["logprobs"].values())
    return ok


def _parse(argv=None):
    from weight_transfer.config import LOAD_MODES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transport", default="broadcast", choices=("broadcast", "cuda_ipc"),
                   help="broadcast: NCCL from GPU 0 to vLLM on GPU 1; cuda_ipc: both on GPU 0")
    p.add_argument("--sizes", default=None, help="comma-separated: 1b, 7b (default 1b,7b; 1b with cuda_ipc)")
    p.add_argument("--buckets", default=",".join(map(str, BUCKETS_MB)), help="bucket sizes in MiB, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="timed updates per bucket size (after one warm-up)")
    p.add_argument("--bare-reps", type=int, default=5, help="timed baseline runs per bucket size (after one warm-up)")
    p.add_argument("--target", type=float, default=None,
                   help="bandwidth ratio target at >= 1 GiB buckets (default 0.8 broadcast, 0.5 cuda_ipc)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vLLM's share of its GPU (default 0.5; 0.3 with cuda_ipc, beside the trainer)")
    p.add_argument("--trainer", default="policy", choices=("policy", "model"),
                   help="policy: a MegatronPolicy (model, gradients, optimizer); model: the megatron model's weights "
                        "alone, exported the same way (7b with cuda_ipc: the policy does not fit beside vLLM)")
    p.add_argument("--load", default="auto",
                   help="weight_transfer.load modes, comma-separated (auto, reload, direct); vLLM goes back to the "
                        "checkpoint between modes so each one's updates are checked")
    p.add_argument("--before-send", default=",".join(BEFORE_SEND),
                   help="what the trainer does right before each update, comma-separated: idle (updates back to back) "
                        "or forward (a log-prob forward pass, as an RL step's update follows the trainer's own work)")
    p.add_argument("--timeout", type=float, default=300.0, help="transport timeout, seconds")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--workdir", default=None, help="where the random checkpoints go (default: a temp dir)")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU: tiny model, gloo broadcast, vLLM on CPU, KiB buckets (checks the code path, not speed)")
    args = p.parse_args(argv)
    ipc = args.transport == "cuda_ipc"
    args.sizes = [s.strip() for s in (args.sizes or ("1b" if ipc else "1b,7b")).split(",") if s.strip()]
    args.target = args.target if args.target is not None else (0.5 if ipc else 0.8)
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.3 if ipc else 0.5
    if ipc and args.dry_run:
        p.error("--dry-run runs the broadcast transport over gloo; cuda_ipc needs a GPU")
    if ipc and "7b" in args.sizes and args.trainer == "policy":
        p.error("--sizes 7b with --transport cuda_ipc: a 7B policy with its optimizer (~120 GB) and vLLM do "
                "not fit on one H200; add --trainer model (the megatron model's weights alone)")
    args.buckets = [int(b) for b in args.buckets.split(",")]
    args.load = [m.strip() for m in args.load.split(",") if m.strip()]
    args.before_send = [m.strip() for m in args.before_send.split(",") if m.strip()]
    for m in args.before_send:
        if m not in BEFORE_SEND:
            p.error(f"--before-send: unknown {m!r}; use one of {BEFORE_SEND}")
    for m in args.load:
        if m not in LOAD_MODES:
            p.error(f"--load: unknown {m!r}; use one of {LOAD_MODES}")
    if args.dry_run:
        args.sizes, args.reps, args.bare_reps = ["tiny"], 1, 2
        args.buckets = [b for b in args.buckets if b <= 1] or [1]
    for s in args.sizes:
        if s not in SHAPES:
            p.error(f"--sizes: unknown {s!r}; use 1b, 7b")
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    cuda = not args.dry_run
    if cuda:
        # This process only drives vLLM: it and the engine it starts see one GPU (GPU 1 for broadcast, the
        # trainer's GPU 0 for cuda_ipc); the trainer and the baseline ranks set their own device first.
        os.environ["CUDA_VISIBLE_DEVICES"] = "0" if args.transport == "cuda_ipc" else "1"
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_nccl_transfer."))
    results = {}
    t0 = time.perf_counter()
    try:
        for size in args.sizes:
            results[size] = run_size(size, args, cuda, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    ok = print_table(results, args.target, args.transport)
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "transport": args.transport, "tolerance": {
            "max": LOGPROB_TOL_MAX, "mean": LOGPROB_TOL_MEAN, "floor_factor": FLOOR_FACTOR}, "target": args.target}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
