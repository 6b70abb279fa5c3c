"""The RL train step through ``MegatronPolicy`` against a bare megatron-core training step, same run.

For a ~1B dense Qwen3 (16 layers x 2048 hidden, GQA 16/4) and a ~1.4B Qwen3-MoE (8 experts, top-2),
built from random HF configs and weights written to a temp dir, at sequence 4096, batch 2, bf16:

- rl: ``MegatronPolicy.train_step`` as the synchronous loop runs it (dynamic micro-batching,
  vocab-parallel log-probs and entropy, GRPO loss with the rollout correction, grad clip, distributed
  Adam; one optimizer step per batch, so the old log-probs are the step's own, detached);
- bare: plain cross-entropy forward/backward and the optimizer step on the same DDP model,
  optimizer and tokens (megatron-core's own fused loss).

The two are timed alternately for ``--rounds`` rounds; medians are reported. Prints tokens/s and MFU
(model FLOPs 6 N + 6 L s h per token, N without the input embedding, of --peak-tflops) and
``rl / bare``, the cost of the RL machinery over the same training done bare (target <= 1.15).

    python benchmarks/bench_train_step.py            # one H200, under 5 minutes
    python benchmarks/bench_train_step.py --quick    # tiny models on CPU (smoke run)
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_layer_specs import TINY, Shape, _sync, _timed  # same shapes and timer as the layer-spec benchmark

TARGET = 1.15


QUICK = TINY


def hf_config(shape: Shape, moe: bool) -> dict:
    """A Qwen3 (dense) or Qwen3-MoE config.json of this shape."""
    common = dict(
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.groups,
        head_dim=shape.hidden // shape.heads,
        vocab_size=shape.vocab,
        max_position_embeddings=shape.seq + 1,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_theta=1e6,
    )
    if not moe:
        return dict(common, model_type="qwen3", architectures=["Qwen3ForCausalLM"], intermediate_size=shape.ffn)
    return dict(
        common,
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        intermediate_size=shape.ffn,
        moe_intermediate_size=shape.moe_ffn,
        num_experts=shape.experts,
        num_experts_per_tok=shape.topk,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def write_random_checkpoint(out: Path, shape: Shape, moe: bool, dtype: torch.dtype) -> Path:
    """Random HF weights of the config, saved with ``save_pretrained`` (built on the GPU when there is one)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(shape, moe)))
    config = AutoConfig.from_pretrained(str(out), local_files_only=True)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(str(out))
    del model
    return out


def rl_batch(shape: Shape, prompt_len: int):
    """Full-length rows, responses in the loss, random advantages and rollout log-probs."""
    from megatron_rl.contracts import TrainingBatch

    g = torch.Generator().manual_seed(0)
    b, s = shape.batch, shape.seq
    ids = torch.randint(0, shape.vocab, (b, s), generator=g)
    attn = torch.ones(b, s)
    loss = attn.clone()
    loss[:, :prompt_len] = 0
    return TrainingBatch(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=loss,
        advantages=torch.randn(b, 1, generator=g).expand(b, s) * loss,
        rollout_logprobs=-torch.rand(b, s, generator=g) * loss,
        group_ids=torch.zeros(b, dtype=torch.long),
        trajectory_ids=[f"t{i}" for i in range(b)],
        prompt_lengths=torch.full((b,), prompt_len),
    )


def rl_step(policy, batch) -> None:
    policy.train_step(batch)


def _bare_loss(policy, tokens):
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)
    return policy.model(inputs, positions, _mask(policy, inputs.shape[1]), labels=labels).float().mean()


def _mask(policy, seq: int):
    """What the policy's own forward passes (None for the fast spec's SDPA, else a causal mask)."""
    from parallel.forward import attention_mask_for

    return attention_mask_for(policy.model, seq)


def bare_step(policy, tokens) -> None:
    policy.model.train()
    policy.model.zero_grad_buffer()
    policy.optimizer.zero_grad()
    _bare_loss(policy, tokens).backward()
    policy.model.finish_grad_sync()
    policy.optimizer.step()


def _flop_params(policy, shape: Shape) -> int:
    """Parameters a token's matmuls touch: no input embedding, top-k of the experts."""
    from parallel.weights.placement import unwrap

    total = 0
    for name, p in unwrap(policy.model).named_parameters():
        if name.startswith("embedding."):
            continue
        total += p.numel() * shape.topk // shape.experts if "local_experts" in name else p.numel()
    return total


def measure(hf_dir: Path, shape: Shape, moe: bool, args, port: int) -> dict:
    from megatron_rl.algorithms.config import AlgorithmConfig
    from parallel.config import OptimizerConfig, TrainerConfig
    from parallel.policy import MegatronPolicy

    gpu = torch.cuda.is_available()
    cfg = TrainerConfig(
        dtype="bfloat16" if gpu else "float32",
        max_tokens_per_micro_batch=shape.batch * shape.seq,
        optimizer=OptimizerConfig(lr=1e-6),
    )
    policy = MegatronPolicy(hf_dir, cfg, AlgorithmConfig(), 0, 1, f"tcp://127.0.0.1:{port}")
    batch = rl_batch(shape, prompt_len=shape.seq // 16)
    tokens = torch.cat([batch.input_ids, batch.input_ids[:, :1]], dim=1).to("cuda" if gpu else "cpu")
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    row = dict(model="MoE" if moe else "dense", tokens=shape.batch * shape.seq, attn=shape.layers * shape.seq * shape.hidden)
    rl, bare = [], []
    for _ in range(args.rounds):
        rl.append(_timed(lambda: rl_step(policy, batch), args.warmup, args.iters))
        bare.append(_timed(lambda: bare_step(policy, tokens), args.warmup, args.iters))
    row["rl_s"], row["bare_s"] = statistics.median(rl), statistics.median(bare)
    row["n"] = _flop_params(policy, shape)
    row["total"] = sum(p.numel() for p in policy.model.module.parameters())
    row["memory"] = policy.memory()
    from parallel.groups import destroy_distributed

    del policy
    destroy_distributed()
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    return row


def _rate(row: dict, seconds: float, per_token: int, peak: float) -> tuple[float, float]:
    """(tokens/s, MFU) with ``per_token * (N + L s h)`` FLOPs per token."""
    tps = row["tokens"] / seconds
    return tps, tps * per_token * (row["n"] + row["attn"]) / (peak * 1e12)


def report(rows: list[dict], peak: float) -> None:
    print(f"\n| model | params (FLOP params) | RL step tokens/s | RL MFU | bare step tokens/s | bare MFU "
          f"| RL / bare | peak memory |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        rl_tps, rl_mfu = _rate(r, r["rl_s"], 6, peak)
        bare_tps, bare_mfu = _rate(r, r["bare_s"], 6, peak)
        peak_gb = r["memory"].get("cuda_peak", r["memory"]["rss"]) / 1e9
        print(
            f"| {r['model']} | {r['total'] / 1e6:.0f}M ({r['n'] / 1e6:.0f}M) | {rl_tps / 1e3:.1f}k | {100 * rl_mfu:.1f}% "
            f"| {bare_tps / 1e3:.1f}k | {100 * bare_mfu:.1f}% | {r['rl_s'] / r['bare_s']:.2f}x | {peak_gb:.1f} GB |"
        )
    worst = max(r["rl_s"] / r["bare_s"] for r in rows)
    print(f"\nRL step over the bare step: worst {worst:.2f}x (target <= {TARGET}x): "
          f"{'met' if worst <= TARGET else 'NOT met'}")


def main() -> None:
    args = _parse()
    shape = QUICK if args.quick else Shape(seq=args.seq, batch=args.batch)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for moe in (False, True):
            start = time.perf_counter()
            hf_dir = write_random_checkpoint(Path(tmp, "moe" if moe else "dense"), shape, moe, dtype)
            rows.append(measure(hf_dir, shape, moe, args, args.port + int(moe)))
            print(f"{rows[-1]['model']}: measured in {time.perf_counter() - start:.0f} s", flush=True)
    report(rows, args.peak_tflops)


def _parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, CPU smoke run")
    parser.add_argument("--iters", type=int, default=3, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before each timing")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rl/bare timings; medians reported")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU")
    parser.add_argument("--port", type=int, default=29571)
    return parser.parse_args()


if __name__ == "__main__":
    main()
