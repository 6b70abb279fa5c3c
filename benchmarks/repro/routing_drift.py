"""Routing drift: how many of a rollout's routed experts change after ONE gradient update, per MoE layer.

Published (GSPO, Qwen, arXiv 2507.18071): on the 48-layer Qwen3-30B-A3B (128 experts, top-8), about 10% of
the experts activated for a rollout change after one gradient update. That is why GRPO needs routing
replay on MoE models: the old policy's log-probs were computed through experts the new policy no longer uses.

What runs: a random Qwen3-MoE checkpoint per shape; a fixed rollout of random token rows (not model
samples), a prompt then a response in the loss, with GRPO advantages from random 0/1 rewards in groups and
the trainer's own log-probs as the rollout's (on-policy, no mismatch). For each learning rate a fresh
``MegatronPolicy`` on the same weights routes the rollout freely (``compute_logprobs(record_routing=True)``),
takes one ``train_step`` at that rate, and routes it again. Per MoE layer: the fraction of (token, top-k slot)
experts not in the token's expert set after the update (sets compared order-free); per token: whether its set
differs in at least one layer. The control routes the same weights twice with no update in between.

Adam's first step moves every parameter with a gradient by about ``lr`` whatever the gradient's size, so
the rate is the step size. Rates: 1e-6 (the trainer default, which the real-model recipes such as
qwen3_30b_a3b keep; the scale of large-MoE RL rates), 1e-5, 1e-4 (tiny_cpu) and 5e-4 (tiny_moe_mismatch_cpu).

    python benchmarks/repro/routing_drift.py                  # tiny + larger shapes on CPU
    python benchmarks/repro/routing_drift.py --quick          # CI smoke: unit shape, few tokens
    python benchmarks/repro/routing_drift.py --shapes gpu --device cuda   # a 1.3B MoE on one GPU, bfloat16

Writes ``routing_drift.json`` and ``routing_drift.png`` (per-layer change, one panel per shape) to ``--out``.

Measured (CPU, float32, 16 rows x 512 tokens, 2026-12-03; README "Reproductions"): after one update the
tiny shape changes 0.05% / 0.20% / 1.06% / 4.74% of its experts at 1e-6 / 1e-5 / 1e-4 / 5e-4, the larger one
(8 x 64, top-8) 0.31% / 2.11% / 15.1% / 45.0%; the control is 0 for both. GSPO's ~10% falls between 1e-5 and
1e-4 on the larger shape. On one H200 (bfloat16, 2026-12-04) the 1.3B shape (24 x 64, top-8) changes 0.86% /
1.62% / 33.8% / 63.1%, over a control of 0.63%: there two passes of the same weights already differ (cause
not isolated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import Parser, positive_int

PUBLISHED = {
    "source": "GSPO (Qwen, arXiv 2507.18071)",
    "model": "Qwen3-30B-A3B, 48 MoE layers, 128 experts, top-8",
    "changed_experts": 0.10,
    "text": "~10% of the experts activated for a rollout change after one gradient update",
}
FULL_LRS = (1e-6, 1e-5, 1e-4, 5e-4)
QUICK_LRS = (1e-6, 1e-3)


@dataclass(frozen=True)
class Shape:
    """A random Qwen3-MoE: a ``megatron_rl.tiny`` size, with HF config fields changed where given."""

    base: str
    """Size name in ``megatron_rl.tiny.models.SIZES``."""
    overrides: dict = field(default_factory=dict)
    """Qwen3MoeConfig fields that differ from the base size (layers, experts, top-k)."""


SHAPES = {
    "tiny": Shape("unit"),  # 2 layers, 4 experts, top-2, hidden 128
    # Qwen3-30B-A3B's sparsity (top-8 of 64 here, of 128 there) at hidden 256, 8 layers: ~55M parameters.
    "larger": Shape("small", dict(num_hidden_layers=8, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=128)),
    # A >= 1B MoE for one GPU: 24 layers, hidden 1024, top-8 of 64 experts of width 256 (~1.3B parameters).
    "gpu": Shape("gpu_moe", dict(num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256)),
}


def _lrs(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 1e-6,1e-4, got {text!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"learning rates must be finite and > 0, got {text!r}")
    return values


def _shapes(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown shape {unknown[0]!r}; choose from {','.join(SHAPES)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="routing_drift", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke run: tiny shape, 4 rows of 64 tokens, 2 rates")
    p.add_argument("--shapes", type=_shapes, help=f"comma list of {','.join(SHAPES)} (default tiny,larger)")
    p.add_argument("--lrs", type=_lrs, help="comma list of learning rates (default 1e-6,1e-5,1e-4,5e-4)")
    p.add_argument("--rows", type=positive_int, help="rollout rows (default 16)")
    p.add_argument("--seq", type=positive_int, help="tokens per row, prompt included (default 512)")
    p.add_argument("--group", type=positive_int, default=4, help="rows per prompt group (GRPO advantages)")
    p.add_argument("--prompt-len", type=positive_int, help="prompt tokens at the start of each row (default seq/4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the rollout")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where available, else cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--out", type=Path, default=Path("routing_drift_out"), help="folder for the JSON and the plot")
    args = p.parse_args(argv)
    quick = args.quick
    args.shapes = args.shapes or (("tiny",) if quick else ("tiny", "larger"))
    args.lrs = args.lrs or (QUICK_LRS if quick else FULL_LRS)
    args.rows = args.rows or (4 if quick else 16)
    args.seq = args.seq or (64 if quick else 512)
    args.prompt_len = args.prompt_len or max(1, args.seq // 4)
    if args.prompt_len >= args.seq:
        p.error(f"argument --prompt-len: {args.prompt_len} leaves no response in rows of --seq {args.seq}")
    if args.rows % args.group:
        p.error(f"argument --group: {args.group} does not divide --rows {args.rows}")
    return args


def _pick_device(args: argparse.Namespace) -> None:
    """Fix the device before anything touches CUDA: the trainer computes on CUDA whenever it sees a GPU."""
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("routing_drift: --device cuda: torch sees no CUDA device here")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")


# ---- the measurement: pure tensor math --------------------------------------------------------------


def expert_change(before, after, num_experts: int) -> dict:
    """Compare two routings ``[tokens, layers, top_k]`` of the same tokens, each token's experts as a set.

    Returns per-layer fractions of (token, slot) experts that are not in the token's other set, their mean,
    and the fraction of tokens whose set differs in at least one layer.
    """
    import torch

    assert before.shape == after.shape, (before.shape, after.shape)
    top_k = before.shape[-1]
    onehot = lambda idx: torch.zeros(*idx.shape[:-1], num_experts, dtype=torch.bool).scatter_(-1, idx, True)  # noqa: E731
    kept = (onehot(before) & onehot(after)).sum(-1)  # [tokens, layers] experts in both sets
    per_layer = (top_k - kept).sum(0).double() / (before.shape[0] * top_k)
    return {
        "per_layer": per_layer.tolist(),
        "mean": float(per_layer.mean()),
        "tokens_any_layer": float((kept < top_k).any(-1).double().mean()),
    }


# ---- the parts that run the trainer ---------------------------------------------------------------


def checkpoint(name: str, folder: Path, seed: int) -> Path:
    """The shape's random HF checkpoint: the tiny kit's own, or its config with the overrides."""
    from megatron_rl.tiny import make_tiny_model

    shape = SHAPES[name]
    base = make_tiny_model("qwen3_moe", size=shape.base, seed=seed)
    if not shape.overrides:
        return base
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base, local_files_only=True)
    for key, value in shape.overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    out = folder / name
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(out))
    return out


def rollout(vocab_size: int, args: argparse.Namespace):
    """The fixed rollout: random rows, responses in the loss, GRPO advantages of random 0/1 rewards."""
    import torch

    from megatron_rl.algorithms.advantages import grpo
    from megatron_rl.algorithms.config import AlgorithmConfig
    from megatron_rl.contracts import TrainingBatch

    g = torch.Generator().manual_seed(args.seed)
    rows, seq = args.rows, args.seq
    loss = torch.ones(rows, seq)
    loss[:, : args.prompt_len] = 0
    groups = torch.arange(rows) // args.group
    rewards = torch.randint(0, 2, (rows,), generator=g).float()
    advantages, _ = grpo(rewards, loss, groups, AlgorithmConfig())
    return TrainingBatch(
        input_ids=torch.randint(0, vocab_size, (rows, seq), generator=g),
        attention_mask=torch.ones(rows, seq),
        loss_mask=loss,
        advantages=advantages,
        rollout_logprobs=torch.zeros(rows, seq),
        group_ids=groups,
        trajectory_ids=[f"r{i}" for i in range(rows)],
        prompt_lengths=torch.full((rows,), args.prompt_len),
    )


def _routing(policy, batch):
    """(log-probs, routed experts of every token ``[tokens, layers, top_k]``, experts per layer)."""
    import torch

    logp, _, records = policy.compute_logprobs(batch, record_routing=True)
    return logp, torch.cat([r.indices for r in records]), records[0].num_experts


def one_update(hf_dir: Path, batch, lr: float, args: argparse.Namespace, control: bool) -> dict:
    """Routing before and after one update at ``lr`` from the checkpoint's weights (a fresh policy)."""
    from megatron_rl.algorithms.config import AlgorithmConfig
    from parallel.config import TrainerConfig
    from parallel.groups import destroy_distributed
    from parallel.policy import MegatronPolicy
    from weight_transfer.session import free_port

    cfg = TrainerConfig(dtype=args.dtype, max_tokens_per_micro_batch=max(args.seq, 4096))
    policy = MegatronPolicy(hf_dir, cfg, AlgorithmConfig(), 0, 1, f"tcp://127.0.0.1:{free_port()}")
    try:
        logp, before, experts = _routing(policy, batch)
        row = {"lr": lr, "tokens": int(before.shape[0])}
        if control:  # the same weights routed again: any change here is noise, not the update
            row["control"] = expert_change(before, _routing(policy, batch)[1], experts)
        on_policy = dataclasses.replace(batch, rollout_logprobs=logp * batch.loss_mask)
        metrics = policy.train_step(on_policy, lr=lr)
        row.update(expert_change(before, _routing(policy, on_policy)[1], experts))
        row["grad_norm"] = metrics["policy/grad_norm"]
        return row
    finally:
        del policy
        destroy_distributed()


def measure_shape(name: str, folder: Path, args: argparse.Namespace) -> dict:
    from transformers import AutoConfig

    hf_dir = checkpoint(name, folder, args.seed)
    config = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    batch = rollout(config.vocab_size, args)
    result = {
        "shape": name,
        "layers": config.num_hidden_layers,
        "experts": config.num_experts,
        "top_k": config.num_experts_per_tok,
        "hidden": config.hidden_size,
        "updates": [],
    }
    for i, lr in enumerate(args.lrs):
        start = time.perf_counter()
        result["updates"].append(one_update(hf_dir, batch, lr, args, control=i == 0))
        u = result["updates"][-1]
        print(f"{name} lr={lr:g}: {100 * u['mean']:.2f}% of experts changed, "
              f"{100 * u['tokens_any_layer']:.1f}% of tokens in >=1 layer ({time.perf_counter() - start:.0f} s)", flush=True)
    return result


# ---- report -----------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def table(results: list[dict]) -> str:
    """Markdown: one row per shape and rate (and the shape's no-update control), GSPO's number beside."""
    lines = [
        "| shape | layers x experts, top-k | tokens | lr | experts changed, mean over layers (min-max) "
        f"| tokens changed in >= 1 layer | published: {PUBLISHED['source']}, {PUBLISHED['model']} |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        dims = f"{r['layers']} x {r['experts']}, top-{r['top_k']}"
        first = r["updates"][0]
        rows = [("no update (control)", first["control"], first["tokens"])]
        rows += [(f"{u['lr']:g}", u, u["tokens"]) for u in r["updates"]]
        for lr, c, tokens in rows:
            spread = f"{_pct(c['mean'])} ({_pct(min(c['per_layer']))}-{_pct(max(c['per_layer']))})"
            published = "-" if lr.startswith("no update") else f"~{PUBLISHED['changed_experts']:.0%} of experts changed"
            lines.append(f"| {r['shape']} | {dims} | {tokens} | {lr} | {spread} | {_pct(c['tokens_any_layer'])} | {published} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """Per-layer change after one update, a panel per shape, a line per rate, the no-update control (the noise
    floor: zero in float32 on CPU, not in bfloat16 on a GPU) in grey, GSPO's ~10% dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results):
        for u in r["updates"]:
            ax.plot(range(len(u["per_layer"])), [100 * v for v in u["per_layer"]], marker="o", label=f"lr {u['lr']:g}")
        control = r["updates"][0]["control"]["per_layer"]
        ax.plot(range(len(control)), [100 * v for v in control], color="grey", marker=".", label="no update (control)")
        ax.axhline(100 * PUBLISHED["changed_experts"], color="k", ls="--", lw=1, label="GSPO, Qwen3-30B-A3B")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.set_ylim(0, 100)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set(title=f"{r['shape']}: {r['layers']} layers, top-{r['top_k']} of {r['experts']}",
               xlabel="MoE layer", ylabel="experts changed after 1 update (%)")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _pick_device(args)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure_shape(name, Path(tmp), args) for name in args.shapes]
    report = {
        "command": " ".join(["python", *sys.argv]),
        "device": args.device,
        "dtype": args.dtype,
        "rollout": {"rows": args.rows, "seq": args.seq, "prompt_len": args.prompt_len, "group": args.group,
                    "tokens": "random ids; GRPO advantages of random 0/1 rewards", "seed": args.seed},
        "published": PUBLISHED,
        "results": results,
    }
    (args.out / "routing_drift.json").write_text(json.dumps(report, indent=1))
    plot(results, args.out / "routing_drift.png")
    print()
    print(table(results))
    print(f"\nwrote {args.out / 'routing_drift.json'} and {args.out / 'routing_drift.png'}")


if __name__ == "__main__":
    main()
