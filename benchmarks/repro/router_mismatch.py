"""Router mismatch: how often the sampler's MoE routers choose other experts than the trainer's on the same
tokens, and what rollout routing replay (R3) does to the sampler/trainer gap.

Published (R3, Ma et al., arXiv 2510.11370, Qwen3-30B-A3B, bf16 engines): ~10% of the routers disagree
between sampler and trainer per forward, 94% of the tokens differ in at least one layer, and the
train-inference KL is about 2x lower with R3 than without.

What runs: the real job (``megatron-rl train recipe=tiny_moe_mismatch_cpu`` with 20 SFT steps: a unit-size
tiny Qwen3-MoE, 2 MoE layers, top-2 of 4 experts, expert parallel over 2 megatron-core ranks in float32, one
vLLM CPU server) once per setting and seed. The sampler's precision is set apart from the trainer's with
``inference.server.dtype``: vLLM's CPU build serves the model in bfloat16 (weights and activations; the
trainer's float32 weights are cast when they load), so the two engines differ as a bf16 GPU sampler and its
trainer do. Per step the run logs:

- ``routing/disagreement``: under R3 the trainer replays the sampler's experts and also computes its routers'
  own top-k; the share of (token, MoE layer) pairs where the two sets differ. ``routing/tokens_differing``:
  tokens whose set differs in at least one layer. Without replay nothing is replayed and nothing compared.
- ``policy/rollout_train_k3_kl`` and ``..._logprob_abs_diff``: KL(trainer || sampler) by k3 and the mean
  |log p| gap on the sampled tokens, with and without R3.

Settings: float32 sampler with R3 (the control: the engines agree), bfloat16 sampler with R3, bfloat16
sampler without replay.

``--gpu`` runs ``tiny_moe_gpu`` instead: a 1.3B Qwen3-MoE (24 MoE layers, top-2 of 16 experts) with the
trainer (megatron-core) and a CUDA vLLM engine on one GPU, both in bfloat16, so the engines differ only by
their kernels, as in the paper. vLLM captures the routed experts itself (``--enable-return-routed-experts``).
Settings: R3 and no replay; there is no float32 control on the GPU (the trainer stays in bfloat16).

    python benchmarks/repro/router_mismatch.py              # 3 settings x 3 seeds x 5 steps, ~15 min on CPU
    python benchmarks/repro/router_mismatch.py --quick      # CI smoke: 1 seed, 1 step, 2 SFT steps
    python benchmarks/repro/router_mismatch.py --gpu --steps 3   # one GPU: 2 settings x 3 seeds, ~15 min

A run whose folder already holds all its steps is read, not run again, so a long series can be split over
several invocations with the same ``--out``.

Writes ``router_mismatch.json`` and ``router_mismatch.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from common import Parser, median_range, positive_int, publish, train

PUBLISHED = {
    "source": "R3 (Ma et al., arXiv 2510.11370)",
    "model": "Qwen3-30B-A3B, bf16 sampler and trainer",
    "disagreement": 0.10,
    "tokens_differing": 0.94,
    "kl_ratio_without_r3": 2.0,
}
SETTINGS = {
    "float32 sampler, R3 (control)": {"inference.server.dtype": "float32", "algorithm.routing_replay.mode": "r3"},
    "bfloat16 sampler, R3": {"inference.server.dtype": "bfloat16", "algorithm.routing_replay.mode": "r3"},
    "bfloat16 sampler, no replay": {"inference.server.dtype": "bfloat16", "algorithm.routing_replay.mode": "none"},
}
GPU_SETTINGS = {
    "bfloat16 sampler and trainer, R3": {"algorithm.routing_replay.mode": "r3"},
    "bfloat16 sampler and trainer, no replay": {"algorithm.routing_replay.mode": "none"},
}
METRICS = ("routing/disagreement", "routing/tokens_differing", "policy/rollout_train_k3_kl",
           "policy/rollout_train_logprob_abs_diff")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="router_mismatch", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke run: 1 seed, 1 step, 2 SFT steps")
    p.add_argument("--gpu", action="store_true", help="tiny_moe_gpu (1.3B MoE, bf16) on one GPU instead of tiny_moe_mismatch_cpu")
    p.add_argument("--seeds", type=positive_int, help="seeds per setting (default 3)")
    p.add_argument("--steps", type=positive_int, help="RL steps per run (default 5)")
    p.add_argument("--sft-steps", type=positive_int, help="SFT warm-start steps (default: 20 on CPU, the recipe's on GPU)")
    p.add_argument("--out", type=Path, default=Path("router_mismatch_out"), help="folder for the runs, JSON and plot")
    args = p.parse_args(argv)
    quick = (1, 1, 2) if args.quick else (3, 5, None if args.gpu else 20)  # 20: what results/ was measured with
    args.seeds, args.steps, args.sft_steps = (args.seeds or quick[0], args.steps or quick[1], args.sft_steps or quick[2])
    args.recipe = "tiny_moe_gpu" if args.gpu else "tiny_moe_mismatch_cpu"  # each setting sets the sampler dtype
    args.settings = GPU_SETTINGS if args.gpu else SETTINGS
    return args


def run(name: str, overrides: dict, seed: int, args: argparse.Namespace) -> list[dict]:
    """One training run of the recipe with ``overrides``; its per-step metrics."""
    run_name = f"{name.split(',')[0].split()[0]}-{overrides['algorithm.routing_replay.mode']}-s{seed}"
    words = [f"recipe={args.recipe}", f"run.seed={seed}", f"schedule.total_steps={args.steps}", "schedule.eval_every=0",
             "schedule.checkpoint_every=0", *(f"{k}={v}" for k, v in overrides.items())]
    if args.sft_steps:
        words.append(f"sft.steps={args.sft_steps}")
    return train(args.out, run_name, words, "router_mismatch", steps=args.steps)


def summarize(steps: list[dict]) -> dict:
    """Mean over a run's steps of each metric it logged (None where it logs none: no replay, no comparison)."""
    return {k: statistics.fmean(s[k] for s in steps) if all(k in s for s in steps) else None for k in METRICS}


def table(results: dict[str, list[dict]]) -> str:
    """Markdown: one row per setting (median over seeds, min-max), the R3 paper's numbers beside."""
    lines = ["| setting | routers disagreeing | tokens differing in >= 1 layer | k3 KL(trainer, sampler) "
             "| mean abs log-prob gap |", "|---|---|---|---|---|"]
    for name, runs in results.items():
        cols = [median_range([r[k] for r in runs], pct=k.startswith("routing/")) for k in METRICS]
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    lines.append(f"| published: {PUBLISHED['source']}, {PUBLISHED['model']} | ~{PUBLISHED['disagreement']:.0%} "
                 f"| {PUBLISHED['tokens_differing']:.0%} | ~{PUBLISHED['kl_ratio_without_r3']:g}x lower with R3 | - |")
    with_r3 = next(runs for name, runs in results.items() if name.startswith("bfloat16") and name.endswith("R3"))
    without = next(runs for name, runs in results.items() if name.endswith("no replay"))
    with_r3, without = ([r["policy/rollout_train_k3_kl"] for r in runs] for runs in (with_r3, without))
    if statistics.median(with_r3) > 0:
        lines.append(f"\nk3 KL without replay / with R3 (bfloat16 sampler, medians): "
                     f"{statistics.median(without) / statistics.median(with_r3):.2f}x")
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: Path) -> None:
    """Two panels: router disagreement (R3 settings) and k3 KL per setting, one dot per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = list(results)
    for i, name in enumerate(names):
        runs = results[name]
        if runs[0]["routing/disagreement"] is not None:
            left.scatter([i] * len(runs), [100 * r["routing/disagreement"] for r in runs], color="C0")
        right.scatter([i] * len(runs), [r["policy/rollout_train_k3_kl"] for r in runs], color="C1")
    left.axhline(100 * PUBLISHED["disagreement"], color="k", ls="--", lw=1, label="R3 paper, Qwen3-30B-A3B")
    left.set(ylabel="routers disagreeing (%)", title="sampler vs trainer routing (R3 runs)")
    left.legend(fontsize=7)
    right.set(ylabel="k3 KL(trainer, sampler)", title="rollout/trainer mismatch")
    right.set_yscale("symlog", linthresh=1e-7)
    for ax in (left, right):
        ax.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {name: [summarize(run(name, overrides, seed, args)) for seed in range(args.seeds)]
               for name, overrides in args.settings.items()}
    report = {"recipe": args.recipe, "seeds": args.seeds, "steps": args.steps, "sft_steps": args.sft_steps,
              "published": PUBLISHED, "results": results}
    publish(args.out, "router_mismatch", report, lambda path: plot(results, path), table(results))


if __name__ == "__main__":
    main()
