"""R2 vs R3: which routing replay a MoE policy needs as one batch is split into more optimizer steps.

Published (Qwen, "Stabilizing Reinforcement Learning with LLMs", arXiv 2512.01374, Qwen3-30B-A3B): fully
on-policy training (one optimizer step per batch) needs no routing replay; with a global batch 2x the
mini-batch, R2 (replaying the routing of the trainer's old-log-prob pass) suffices; at 4x and beyond R3
(replaying the sampler's routing) is needed to keep training stable.

What runs: the real job (``megatron-rl train recipe=tiny_moe_mismatch_cpu``, a bf16 sampler and 150 SFT steps: a
unit-size tiny Qwen3-MoE, 2 MoE layers, top-2 of 4 experts, expert parallel over 2 megatron-core ranks in
float32) with its vLLM CPU sampler in bfloat16
(``inference.server.dtype=bfloat16``), so sampler and trainer differ as bf16 engines do. Each batch of 8
groups is cut into 8 / ratio mini-batches (``algorithm.ppo_mini_batch_size``), one optimizer step each, with
the trainer's own old-log-prob pass as the clip ratio's reference. Per ratio (1, 2, 4) and replay (none, R2,
R3; R2 only where a batch takes several steps) the run logs per step, averaged here over its steps. The SFT warm
start is 150 steps (the recipe's 20 leave every reward at 0, so no advantage and no gradient; after 150 about half
the answers are right):

- ``policy/ppo_kl`` and ``policy/ppo_clip_ratio``: how far the mini-batches' policy moved from the batch's old
  policy (the lag the ratio adds) and the share of tokens the PPO clip cut;
- ``policy/rollout_train_k3_kl``: KL(trainer || sampler) on the sampled tokens, with the trainer's log-probs of
  each mini-batch's own step (so past the first mini-batch it includes the policy's lag as well as the engines'
  mismatch);
- ``routing/disagreement``: under R3 the trainer's own top-k against the replayed sampler experts; under R2
  the expert change since the old-log-prob pass, over the later mini-batches;
- ``policy/grad_norm`` and the training reward (mean of the first and of the last 5 steps).

    python benchmarks/repro/r2_vs_r3.py           # 8 settings x 2 seeds x 20 steps, ~22 min on 2 CPU cores
    python benchmarks/repro/r2_vs_r3.py --quick   # CI smoke: ratio 2 with R2 and R3, 1 seed, 1 step

Writes ``r2_vs_r3.json`` and ``r2_vs_r3.png`` to ``--out``. A run whose folder already holds all its steps is
read, not run again.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from common import Parser, median_range, positive_int, publish, train

PUBLISHED = {
    "source": "Qwen, Stabilizing RL with LLMs (arXiv 2512.01374)",
    "model": "Qwen3-30B-A3B",
    "claim": {1: "no replay needed", 2: "R2 suffices", 4: "R3 needed"},
}
BATCH_GROUPS = 8
RATIOS = (1, 2, 4)
MODES = ("none", "r2", "r3")
WINDOW = 5
RECIPE = "tiny_moe_mismatch_cpu"
METRICS = ("policy/ppo_kl", "policy/ppo_clip_ratio", "policy/rollout_train_k3_kl", "routing/disagreement",
           "policy/grad_norm", "reward/mean")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="r2_vs_r3", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke run: ratio 2, R2 and R3, 1 seed, 1 step")
    p.add_argument("--seeds", type=positive_int, help="seeds per setting (default 2)")
    p.add_argument("--steps", type=positive_int, help="RL steps per run (default 20)")
    p.add_argument("--sft-steps", type=positive_int, help="SFT warm-start steps (default: the recipe's 150)")
    p.add_argument("--out", type=Path, default=Path("r2_vs_r3_out"), help="folder for the runs, JSON and plot")
    args = p.parse_args(argv)
    quick = (1, 1) if args.quick else (2, 20)
    args.seeds, args.steps = args.seeds or quick[0], args.steps or quick[1]
    args.settings = [(2, "r2"), (2, "r3")] if args.quick else [
        (ratio, mode) for ratio in RATIOS for mode in MODES if not (ratio == 1 and mode == "r2")]
    return args


def run(ratio: int, mode: str, seed: int, args: argparse.Namespace) -> list[dict]:
    """One ``tiny_moe_mismatch_cpu`` run at this batch/mini-batch ratio and replay; its per-step metrics."""
    words = [f"recipe={RECIPE}", f"run.seed={seed}", f"schedule.total_steps={args.steps}", "schedule.eval_every=0",
             f"data.train_batch_size={BATCH_GROUPS}",
             f"algorithm.ppo_mini_batch_size={BATCH_GROUPS // ratio}", f"algorithm.routing_replay.mode={mode}",
             *([f"sft.steps={args.sft_steps}"] if args.sft_steps else [])]
    return train(args.out, f"ratio{ratio}-{mode}-s{seed}", words, "r2_vs_r3", steps=args.steps)


def summarize(steps: list[dict]) -> dict:
    """Means over a run's steps (None where it logs none), and its training reward over the first and the last
    ``WINDOW`` steps."""
    out = {k: statistics.fmean(s[k] for s in steps) if all(k in s for s in steps) else None for k in METRICS}
    window = min(WINDOW, len(steps))
    out["reward/first"] = statistics.fmean(s["reward/mean"] for s in steps[:window])
    out["reward/last"] = statistics.fmean(s["reward/mean"] for s in steps[-window:])
    return out


def table(results: dict[str, list[dict]]) -> str:
    """Markdown: one row per (ratio, replay), medians over seeds (min-max), the paper's claim per ratio."""
    lines = ["| batch / mini-batch | replay | PPO KL (lag) | PPO clip | k3 KL(trainer, sampler) | routers changed "
             "| grad norm | reward, first 5 -> last 5 steps | published |", "|---|---|---|---|---|---|---|---|---|"]
    for key, runs in results.items():
        ratio, mode = key.split("/")
        cols = [median_range([r[k] for r in runs], pct=k in ("policy/ppo_clip_ratio", "routing/disagreement"))
                for k in METRICS[:-1]]
        reward = (f"{statistics.median(r['reward/first'] for r in runs):.3f} -> "
                  f"{statistics.median(r['reward/last'] for r in runs):.3f}")
        claim = PUBLISHED["claim"][int(ratio)]
        lines.append(f"| {ratio} | {mode} | " + " | ".join(cols) + f" | {reward} | {claim} |")
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: Path) -> None:
    """Three panels over the ratio, one line per replay: PPO KL, k3 KL(trainer, sampler), routers changed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("policy/ppo_kl", "PPO KL to the batch's old policy"),
              ("policy/rollout_train_k3_kl", "k3 KL(trainer, sampler)"),
              ("routing/disagreement", "routers changed / disagreeing"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (metric, title) in zip(axes, panels):
        for color, mode in enumerate(MODES):
            points = [(int(k.split("/")[0]), statistics.median(r[metric] for r in runs))
                      for k, runs in results.items() if k.endswith(f"/{mode}") and runs[0][metric] is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=mode, color=f"C{color}")
        ax.set(xlabel="batch / mini-batch", title=title, xticks=RATIOS)
        ax.set_yscale("symlog", linthresh=1e-6)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {f"{ratio}/{mode}": [summarize(run(ratio, mode, seed, args)) for seed in range(args.seeds)]
               for ratio, mode in args.settings}
    report = {"recipe": RECIPE, "batch_groups": BATCH_GROUPS, "seeds": args.seeds, "steps": args.steps,
              "sft_steps": args.sft_steps, "published": PUBLISHED, "results": results}
    publish(args.out, "r2_vs_r3", report, lambda path: plot(results, path), table(results))


if __name__ == "__main__":
    main()
