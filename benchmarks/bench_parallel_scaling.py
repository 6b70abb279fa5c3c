"""RL train step through MegatronPolicy on 1 vs 2 GPUs: TP=2 vs TP=1 (dense), EP=2 vs EP=1 (MoE).

One RL step = the old-log-prob pass (``compute_logprobs``, no grad) then ``train_step`` (clipped-ratio
policy update, megatron's Adam with fp32 master weights), on a fixed global batch of --rows x --seq
tokens, bf16, local layer spec with SDPA attention (no TE). Models (random weights, Qwen3 / Qwen3-MoE):
dense 16 layers x 2048, GQA 16/4, FFN 5632 (0.86B); MoE the same attention with 8 experts top-2, expert
FFN 1408 (1.4B, 0.5B active). Layouts on two GPUs split the batch over data-parallel ranks where the
layout leaves some (EP=2 runs attention data-parallel). MFU = tokens/s x (8 N_active + 8 L s h) /
(peak x GPUs), as benchmarks/bench_layer_specs.py counts the RL step.

    export PYTHONPATH=$PWD:/tmp/site    # after .ci/gpu-install.sh /tmp/pieces /tmp/site (README: GPUs)
    python benchmarks/bench_parallel_scaling.py               # 2 GPUs, seq 4096
    python benchmarks/bench_parallel_scaling.py --seq 2048    # if memory or time is tight
    python benchmarks/bench_parallel_scaling.py --dry-run     # CPU: tiny shapes over gloo
"""

from __future__ import annotations

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast must stay off on the H200 machines

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO, REPO / "tests" / "integration" / "parallel"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

# layers, hidden, heads, kv heads, ffn, experts, top-k, expert ffn, vocab
MODELS = {
    "dense": (16, 2048, 16, 4, 5632, 0, 0, 0, 32768),
    "moe": (16, 2048, 16, 4, 5632, 8, 2, 1408, 32768),
}
TINY = {
    "dense": (2, 64, 4, 2, 128, 0, 0, 0, 2048),
    "moe": (2, 64, 4, 2, 128, 4, 2, 32, 2048),
}
# (name, GPUs, layout kwargs)
LAYOUTS = {"dense": [("TP=1", 1, {}), ("TP=2", 2, {"tp": 2})],
           "moe": [("EP=1", 1, {}), ("EP=2", 2, {"ep": 2})]}
DP2 = ("DP=2 (TP=1)", 2, {})


def write_model(out: Path, shape: tuple, dtype, device: str) -> dict:
    """Random HF checkpoint (config, weights, the tiny kit's tokenizer); returns its parameter counts."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    from megatron_rl.tiny import make_tiny_model

    layers, hidden, heads, kv, ffn, experts, topk, moe_ffn, vocab = shape
    tiny = Path(make_tiny_model("qwen3", size="unit", seed=0))
    out.mkdir(parents=True, exist_ok=True)
    for f in tiny.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors", "tiny_model.json", "generation_config.json"):
            shutil.copy(f, out / f.name)
    common = dict(vocab_size=max(vocab, json.loads((tiny / "config.json").read_text())["vocab_size"]),
                  hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  intermediate_size=ffn, head_dim=hidden // heads, max_position_embeddings=8192,
                  tie_word_embeddings=False, rms_norm_eps=1e-6, eos_token_id=2, pad_token_id=0, bos_token_id=None)
    if experts:
        config = Qwen3MoeConfig(num_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=moe_ffn,
                                norm_topk_prob=True, decoder_sparse_step=1, **common)
    else:
        config = Qwen3Config(**common)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(str(out), safe_serialization=True)
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"total": total, "active": total - expert + (expert * topk // experts if experts else 0)}


def scale_rank(rank, world, init_method, hf_dir, layout, rows, seq, micro_tokens, warmup, iters):
    """On each rank: build the policy, run warm-up and timed RL steps; (step seconds, peak bytes)."""
    import dataclasses

    import torch

    from megatron_rl.algorithms.config import AlgorithmConfig
    from parallel.policy import MegatronPolicy
    from parallel_ranks import batch_of, trainer_config

    cuda = torch.cuda.is_available()
    cfg = trainer_config(**layout, num_ranks=world, dtype="bfloat16" if cuda else "float32",
                         max_tokens_per_micro_batch=micro_tokens)
    policy = MegatronPolicy(hf_dir, cfg, AlgorithmConfig(), rank, world, init_method)
    gen = torch.Generator().manual_seed(0)
    batch = batch_of(torch.randint(3, 2000, (rows, seq), generator=gen).tolist(), prompt_len=seq // 8)
    batch = dataclasses.replace(batch, advantages=torch.randn(rows, seq, generator=gen) * batch.loss_mask)

    def step():
        old = policy.compute_logprobs(batch)[0]
        policy.train_step(dataclasses.replace(batch, old_logprobs=old, rollout_logprobs=old))

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return {"step_s": sorted(times)[len(times) // 2], "peak_bytes": peak}


def measure(model: str, name: str, gpus: int, layout: dict, hf_dir: Path, counts: dict, shape: tuple, args) -> dict:
    from parallel_launch import run_ranks

    out = Path(tempfile.mkdtemp(prefix=f"scale-{model}-"))
    start = time.perf_counter()
    try:
        ranks = run_ranks(scale_rank, gpus, out, str(hf_dir), layout, args.rows, args.seq, args.micro_tokens,
                          args.warmup, args.iters, timeout=args.timeout)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    step = max(r["step_s"] for r in ranks)
    tokens = args.rows * args.seq
    layers, hidden = shape[0], shape[1]
    flops_per_token = 8 * counts["active"] + 8 * layers * args.seq * hidden
    tps = tokens / step
    row = dict(model=model, layout=name, gpus=gpus, total=counts["total"], active=counts["active"], step_s=step,
               tokens_per_s=tps, tokens_per_s_gpu=tps / gpus, mfu=tps * flops_per_token / (args.peak_tflops * 1e12 * gpus),
               peak_gb=max(r["peak_bytes"] for r in ranks) / 1e9, wall_s=time.perf_counter() - start)
    print(format_row(row), flush=True)
    return row


HEADER = ("| model | layout | GPUs | step s | tokens/s | tokens/s/GPU | MFU | peak GB/GPU | run s |\n"
          "|---|---|---|---|---|---|---|---|---|")


def format_row(r: dict) -> str:
    return (f"| {r['model']} {r['total'] / 1e9:.2f}B ({r['active'] / 1e9:.2f}B active) | {r['layout']} | {r['gpus']} "
            f"| {r['step_s']:.3f} | {r['tokens_per_s'] / 1e3:.1f}k | {r['tokens_per_s_gpu'] / 1e3:.1f}k "
            f"| {100 * r['mfu']:.1f}% | {r['peak_gb']:.1f} | {r['wall_s']:.0f} |")


def print_table(rows: list[dict], args) -> None:
    print(f"\nRL step (old-log-prob pass + policy update), {args.rows} x {args.seq} tokens per step, bf16, "
          f"MFU of {args.peak_tflops:.0f} TFLOP/s per GPU")
    print(HEADER)
    for r in rows:
        print(format_row(r))
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        base = mine[0]
        for r in mine[1:]:
            print(f"{model}: {r['layout']} vs {base['layout']}: x{r['tokens_per_s'] / base['tokens_per_s']:.2f} tokens/s "
                  f"(x{r['tokens_per_s_gpu'] / base['tokens_per_s_gpu']:.2f} per GPU)")


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="dense,moe", help="comma-separated: dense, moe")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--rows", type=int, default=4, help="rows per global batch (split over data-parallel ranks)")
    p.add_argument("--micro-tokens", type=int, default=8192, help="max_tokens_per_micro_batch")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--with-dp", action="store_true", help="also run TP=1 with DP=2 on two GPUs")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak per GPU")
    p.add_argument("--timeout", type=float, default=420.0, help="per launch, seconds")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--dry-run", action="store_true", help="CPU: tiny shapes, gloo, float32 (checks the code path)")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in args.models:
        if m not in MODELS:
            p.error(f"--models: unknown {m!r}; use dense, moe")
    if args.dry_run:
        args.seq, args.rows, args.micro_tokens, args.iters = 32, 4, 64, 1
    return args


def main(argv=None) -> int:
    import torch

    args = _parse(argv)
    cuda = not args.dry_run and torch.cuda.is_available()
    if not args.dry_run and torch.cuda.device_count() < 2:
        print("bench_parallel_scaling: needs 2 GPUs (or --dry-run on CPU)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench_parallel_scaling."))
    rows, t0 = [], time.perf_counter()
    try:
        for model in args.models:
            shape = (TINY if args.dry_run else MODELS)[model]
            start = time.perf_counter()
            counts = write_model(work / model, shape, torch.bfloat16 if cuda else torch.float32, "cuda" if cuda else "cpu")
            print(f"[{model}] checkpoint {counts['total'] / 1e9:.2f}B written in {time.perf_counter() - start:.0f} s", flush=True)
            layouts = LAYOUTS[model] + ([DP2] if args.with_dp else [])
            for name, gpus, layout in layouts:
                rows.append(measure(model, name, gpus, layout, work / model, counts, shape, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, args)
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
