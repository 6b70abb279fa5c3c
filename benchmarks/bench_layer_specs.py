"""Local layer spec vs the fast spec (SDPA/varlen attention, grouped-GEMM experts), same run.

For a dense and an MoE GPTModel of the same shapes (default: 16 layers x 2048 hidden, GQA 16/4,
sequence 4096, batch 2, bf16, the issue's table) it builds each spec in turn and measures
- train: one full step (forward, backward, megatron's Adam with fp32 master weights),
- rl: the RL train step (a no-grad log-prob pass, then a clipped-ratio policy update),
for each of: megatron's ``local`` spec, ``sdpa`` (the local spec with only core attention swapped for
SDPA: the issue's reference row; for a dense model it is the fast spec itself, so it is measured for MoE
only) and ``fast`` (SDPA attention and grouped-GEMM experts),
printing tokens/s, MFU (model FLOPs per token 6*N_active + 6*L*s*h for the train step, 8*N + 8*L*s*h
for the RL step, of --peak-tflops), peak memory and fast/local ratios. ``--recompute`` adds a row of
the fast spec with activation recompute (MFU still counts model FLOPs, not the recomputed ones; a
comma-separated list adds a row each).
``--profile`` adds a torch profiler summary of the fast MoE train step (time and memory by op). Memory, GPU only: the CUDA
allocator's peak over the steady train steps, its peak over the very first step of a fresh model (Adam
creates its moments inside that step's ``optimizer.step``, after backward has freed the activations,
so this peak is lower: one way a single-step measurement reads), and the static memory between steps
(weights, gradient buffers, optimizer state); both devices: the bytes one forward keeps for backward (distinct non-parameter
storages), the activation memory that recompute trades away.

    python benchmarks/bench_layer_specs.py                           # H200 (one GPU)
    python benchmarks/bench_layer_specs.py --recompute full          # ... and the fast spec with recompute
    python benchmarks/bench_layer_specs.py --tiny --iters 1          # CPU smoke run
    python benchmarks/bench_layer_specs.py --small --recompute full  # CPU activation-memory comparison
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch


@dataclass
class Shape:
    layers: int = 16
    hidden: int = 2048
    heads: int = 16
    groups: int = 4
    ffn: int = 5632
    experts: int = 8
    topk: int = 2
    moe_ffn: int = 1408
    vocab: int = 32768
    seq: int = 4096
    batch: int = 2


TINY = Shape(layers=2, hidden=64, heads=4, groups=2, ffn=128, experts=4, moe_ffn=32, vocab=256, seq=64, batch=2)
SMALL = Shape(layers=4, hidden=512, heads=8, groups=2, ffn=1408, experts=8, moe_ffn=352, vocab=8192, seq=1024, batch=2)
RECOMPUTE = {
    "full": lambda moe: dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    "selective": lambda moe: dict(recompute_granularity="selective", recompute_modules=["core_attn", "moe" if moe else "mlp"]),
}


def main() -> None:
    args = _parse()
    shape = TINY if args.tiny else SMALL if args.small else Shape(seq=args.seq, batch=args.batch)
    recomputes = [("fast", r) for r in args.recompute or []]
    rows = []
    for moe in [model == "moe" for model in args.models.split(",")]:
        for spec, recompute in [("local", None)] + [("sdpa", None)] * moe + [("fast", None)] + recomputes:
            rows.append(_isolated(args.port + len(rows), _measure, shape, moe, spec, args, recompute))
            print(_row(rows[-1]), flush=True)
    if args.profile:
        _isolated(args.port + len(rows), _profile, shape, args)
    _print_table(rows, args.peak_tflops)


def _isolated(port: int, fn, *fn_args):
    """``fn(*fn_args)`` in a fresh process with its own process groups. Every row gets a clean allocator:
    a deleted megatron MoE model is not freed in its process (its DDP stays reachable through hook
    closures), so building the variants one after another in one process inflated later rows' memory
    by the earlier models' buffers (H200: +17 GB on the fast MoE row)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_in_process_group, port, fn, fn_args).result()


def _in_process_group(port: int, fn, fn_args):
    from parallel.config import ParallelConfig
    from parallel.groups import destroy_distributed, init_distributed

    init_distributed(ParallelConfig(), 0, 1, f"tcp://127.0.0.1:{port}")
    try:
        return fn(*fn_args)
    finally:
        destroy_distributed()


def _parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=5, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
    parser.add_argument("--small", action="store_true", help="4 layers x 512 hidden, sequence 1024 (CPU memory runs)")
    parser.add_argument("--recompute", type=_recompute_list,
                        help=f"add the fast spec with these activation recomputes (comma-separated: {', '.join(RECOMPUTE)})")
    parser.add_argument("--profile", action="store_true", help="torch profiler summary of the fast MoE step")
    parser.add_argument("--port", type=int, default=29561)
    parser.add_argument("--models", default="dense,moe", help="comma-separated: dense, moe")
    parser.add_argument("--bf16-grads", action="store_true",
                        help="gradient buffers in bf16 (megatron's default) instead of the toolkit's float32")
    return parser.parse_args()


def _recompute_list(text: str) -> list[str]:
    names = text.split(",")
    if unknown := set(names) - set(RECOMPUTE):
        raise argparse.ArgumentTypeError(f"{sorted(unknown)} unknown, use {', '.join(RECOMPUTE)}")
    return names


def _config(shape: Shape, moe: bool, recompute: str | None = None):
    from megatron.core.transformer.transformer_config import TransformerConfig

    gpu = torch.cuda.is_available()
    dtype = torch.bfloat16 if gpu else torch.float32
    extra = {}
    if moe:
        extra = dict(
            num_moe_experts=shape.experts,
            moe_router_topk=shape.topk,
            moe_ffn_hidden_size=shape.moe_ffn,
            moe_token_dispatcher_type="alltoall" if gpu else "allgather",
            moe_router_load_balancing_type="none",
        )
    return TransformerConfig(
        num_layers=shape.layers,
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        num_query_groups=shape.groups,
        ffn_hidden_size=shape.ffn,
        kv_channels=shape.hidden // shape.heads,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        bias_activation_fusion=gpu,
        normalization="RMSNorm",
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=gpu,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        **extra,
        **(RECOMPUTE[recompute](moe) if recompute else {}),
    )


def _build(shape: Shape, moe: bool, spec_name: str, fp32_grads: bool = True, recompute: str | None = None):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from parallel.layers.attention import SDPAttention
    from parallel.layers.spec import build_layer_spec, norms_in_params_dtype
    from parallel.optim import use_fused_adam

    config = _config(shape, moe, recompute)
    spec = build_layer_spec(config, moe=moe, qk_layernorm=False, prefer="local" if spec_name == "sdpa" else spec_name)
    if spec_name == "sdpa":
        spec.submodules.self_attention.submodules.core_attention = SDPAttention
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=shape.vocab,
        max_sequence_length=shape.seq,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )
    norms_in_params_dtype(model, config.params_dtype)  # as the toolkit's provider does
    if torch.cuda.is_available():
        model.cuda()
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=fp32_grads), model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-6, bf16=config.bf16, use_distributed_optimizer=False),
        [ddp],
        use_gloo_process_groups=not torch.cuda.is_available(),  # parallel.groups makes gloo groups on CPU only
    )
    use_fused_adam(optimizer)  # as the toolkit's trainer does
    return ddp, optimizer


def _logprobs(model, tokens):
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)
    return -model(inputs, positions, None, labels=labels)


def _train_step(model, optimizer, tokens):
    from parallel.forward import release_dispatcher_state

    model.zero_grad_buffer()
    optimizer.zero_grad()
    _logprobs(model, tokens).mean().neg().backward()
    release_dispatcher_state(model)  # as the toolkit's schedule does after every step
    model.finish_grad_sync()
    optimizer.step()


def _rl_step(model, optimizer, tokens, advantages):
    from parallel.forward import release_dispatcher_state

    with torch.no_grad():
        old = _logprobs(model, tokens)
    model.zero_grad_buffer()
    optimizer.zero_grad()
    ratio = torch.exp(_logprobs(model, tokens) - old)
    loss = -torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
    loss.backward()
    release_dispatcher_state(model)
    model.finish_grad_sync()
    optimizer.step()


def _timed(step, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step()
    _sync()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    _sync()
    return (time.perf_counter() - start) / iters


def _measure(shape: Shape, moe: bool, spec: str, args, recompute: str | None = None) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, optimizer = _build(shape, moe, spec, not args.bf16_grads, recompute)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=gen).to(device)
    advantages = torch.randn(shape.batch, shape.seq, generator=gen).to(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _train_step(model, optimizer, tokens)  # the first step: Adam's moments appear inside optimizer.step
    first = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train = _timed(lambda: _train_step(model, optimizer, tokens), max(args.warmup - 1, 0), args.iters)
    # On GPU: the allocator's peak, and what stays allocated between steps (weights, gradient buffers,
    # optimizer state), so that peak - static is what the step itself adds (activations, transients).
    peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
    static = torch.cuda.memory_allocated() / 1e9 if device == "cuda" else None
    saved = _saved_activation_bytes(model, tokens) / 1e9
    rl = _timed(lambda: _rl_step(model, optimizer, tokens, advantages), args.warmup, args.iters)
    row = dict(
        model="MoE" if moe else "dense",
        spec=spec + (f"+{recompute} recompute" if recompute else ""),
        total=_params(model, active=False),
        active=_params(model, active=True, shape=shape),
        train_s=train,
        rl_s=rl,
        peak_gb=peak,
        first_gb=first,
        static_gb=static,
        saved_gb=saved,
        tokens=shape.batch * shape.seq,
        attn_flops=6 * shape.layers * shape.seq * shape.hidden,
    )
    return row


def _saved_activation_bytes(model, tokens) -> int:
    """Bytes the forward keeps for backward (distinct storages other than parameters): the activation
    memory that recompute trades away. CPU runs report it in place of the CUDA allocator's peak."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    model.zero_grad_buffer()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = _logprobs(model, tokens).mean()
    loss.backward()
    return sum(saved.values())


def _params(model, *, active: bool, shape: Shape | None = None) -> int:
    total = 0
    for name, p in model.named_parameters():
        if active and "local_experts" in name:
            total += p.numel() * shape.topk // shape.experts
        else:
            total += p.numel()
    return total


def _mfu(row: dict, seconds: float, per_param: int, peak_tflops: float) -> tuple[float, float]:
    flops_per_token = per_param * row["active"] + per_param / 6 * row["attn_flops"]
    tokens_per_s = row["tokens"] / seconds
    return tokens_per_s, tokens_per_s * flops_per_token / (peak_tflops * 1e12)


def _row(row: dict, peak_tflops: float = 989.0) -> str:
    tps, mfu = _mfu(row, row["train_s"], 6, peak_tflops)
    rl_tps, rl_mfu = _mfu(row, row["rl_s"], 8, peak_tflops)
    memory = (f"{row['peak_gb']:.2f} GB | {row['first_gb']:.2f} GB | {row['static_gb']:.2f} GB | "
              if row["peak_gb"] is not None else "")
    return (
        f"| {row['model']} {row['total'] / 1e6:.0f}M ({row['active'] / 1e6:.0f}M active) | {row['spec']} "
        f"| {tps / 1e3:.1f}k | {100 * mfu:.1f}% | {memory}{row['saved_gb']:.2f} GB "
        f"| {rl_tps / 1e3:.1f}k | {100 * rl_mfu:.1f}% |"
    )


def _print_table(rows: list[dict], peak_tflops: float) -> None:
    memory = "peak memory | first-step peak | static memory | " if torch.cuda.is_available() else ""
    print(f"\n| model | spec | train tokens/s | train MFU (of {peak_tflops:.0f}) | {memory}saved activations "
          "| RL step tokens/s | RL MFU |")
    print("|---|---|---|---|---|---|---|" + ("---|---|---|" if memory else ""))
    for row in rows:
        print(_row(row, peak_tflops))
    for local in (r for r in rows if r["spec"] == "local"):
        for other in (r for r in rows if r["model"] == local["model"] and r is not local):
            key = "peak_gb" if local["peak_gb"] is not None else "saved_gb"
            print(
                f"{other['model']}: {other['spec']}/local train x{local['train_s'] / other['train_s']:.2f}, "
                f"RL step x{local['rl_s'] / other['rl_s']:.2f}, {key[:-3]} memory x{other[key] / local[key]:.2f}"
            )
    for sdpa in (r for r in rows if r["spec"] == "sdpa" and r["peak_gb"] is not None):
        for fast in (r for r in rows if r["model"] == sdpa["model"] and r["spec"].startswith("fast")):
            print(f"{fast['model']}: {fast['spec']} vs the sdpa row (the issue's memory reference): peak "
                  f"{fast['peak_gb']:.2f} vs {sdpa['peak_gb']:.2f} GB, first-step peak {fast['first_gb']:.2f} vs "
                  f"{sdpa['first_gb']:.2f} GB, train x{sdpa['train_s'] / fast['train_s']:.2f}")


def _profile(shape: Shape, args) -> None:
    from torch.profiler import ProfilerActivity, profile

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, optimizer = _build(shape, True, "fast")
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), device=device)
    for _ in range(args.warmup):
        _train_step(model, optimizer, tokens)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        _train_step(model, optimizer, tokens)
        _sync()
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    print("\nfast MoE train step, torch profiler, top kernels/ops:")
    print(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=60))
    memory = "self_cuda_memory_usage" if device == "cuda" else "self_cpu_memory_usage"
    print("\nsame step, ops by the memory they allocate and keep (activations kept for backward show here):")
    print(prof.key_averages().table(sort_by=memory, row_limit=20, max_name_column_width=60))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
