"""Stability under sampler/trainer mismatch: RL runs of a small MoE with and without each correction.

Published: TIS (Yao et al., 2025) and MIS / geometric sequence masking ("When speed kills stability"): without
a correction, the mismatch between the sampler's and the trainer's probabilities makes training drift or
collapse; with it, training holds. IcePop: tokens whose probability ratio leaves about [0.5, 2] must be masked.
R3 (arXiv 2510.11370): without routing replay 3 of 3 Qwen3-30B-A3B runs collapsed, with it none.

What runs: the real job (``megatron-rl train recipe=tiny_moe_mismatch_cpu``, a bf16 sampler and 150 SFT steps: a
unit-size tiny Qwen3-MoE, 2 MoE layers, top-2 of 4 experts, expert parallel over 2 megatron-core ranks in
float32, the recipe's RL rate 5e-4) after a 150-step SFT
warm start, under a real mismatch from two sources at once: the vLLM CPU sampler runs in bfloat16
(``inference.server.dtype=bfloat16``) and the fully asynchronous schedule lets rollouts start up to 4 weight
versions before they are trained on (``schedule.type=fully_async schedule.staleness=4``). The trainer's own
old-log-prob pass is the clip ratio's reference; each correction acts on r = exp(trainer old - rollout).
Settings: R3 with no correction (the recipe), token TIS (cap 2), the geometric sequence mask ([0.99, 1.01]),
IcePop (tokens outside [0.5, 2] masked), and no correction without routing replay.

Per run: the training reward and the share of correct answers over the first and the last 5 steps, the largest
gradient norm, and the mean k3 KL(trainer, sampler). A run *collapsed* when its last-5 correct share fell below
half of its first-5 share, and *drifted* when it fell by more than 0.1 (absolute) without collapsing.

    python benchmarks/repro/stability.py           # 5 settings x 3 seeds x 20 steps, ~22 min on 2 CPU cores
    python benchmarks/repro/stability.py --quick   # CI smoke: no correction and token TIS, 1 seed, 2 steps

Writes ``stability.json`` and ``stability.png`` (correct share and reward per step, a column per setting) to
``--out``.
A run whose folder already holds all its steps is read, not run again.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from common import Parser, positive_int, publish, train

PUBLISHED = {
    "tis": "TIS (Yao et al., 2025): without it the mismatch makes training drift or collapse; with it, it holds",
    "mis": "MIS / geometric mask (When speed kills stability): masking sequences whose ratio leaves a band holds",
    "icepop": "IcePop: beyond a ~5% relative gap per token training fails unless such tokens are masked",
    "r3": "R3 (arXiv 2510.11370): without replay 3/3 Qwen3-30B-A3B runs collapsed, with R3 none",
}
MISMATCH = {"inference.server.dtype": "bfloat16", "schedule.type": "fully_async", "schedule.staleness": 4}
SETTINGS = {
    "R3, no correction": {},
    "R3 + token TIS": {"algorithm.correction.tis_ratio_type": "token"},
    "R3 + geometric mask": {"algorithm.correction.sequence_mask_metric": "geometric"},
    "R3 + IcePop": {"algorithm.correction.token_mask_eps_low": 0.5, "algorithm.correction.token_mask_eps_high": 1.0},
    "no replay, no correction": {"algorithm.routing_replay.mode": "none"},
}
QUICK = ("R3, no correction", "R3 + token TIS")
WINDOW = 5
RECIPE = "tiny_moe_mismatch_cpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="stability", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke run: no correction and token TIS, 1 seed, 2 steps")
    p.add_argument("--seeds", type=positive_int, help="seeds per setting (default 3)")
    p.add_argument("--steps", type=positive_int, help="RL steps per run (default 20)")
    p.add_argument("--sft-steps", type=positive_int, help="SFT warm-start steps (default: the recipe's 150)")
    p.add_argument("--lr", type=float, help="RL learning rate (default: the recipe's 5e-4)")
    p.add_argument("--settings", type=_settings, help=f"comma list of settings by their number, 1-{len(SETTINGS)} in "
                   f"the order {list(SETTINGS)} (default: all)")
    p.add_argument("--out", type=Path, default=Path("stability_out"), help="folder for the runs, JSON and plot")
    args = p.parse_args(argv)
    quick = (1, 2) if args.quick else (3, 20)
    args.seeds, args.steps = args.seeds or quick[0], args.steps or quick[1]
    chosen = args.settings or (QUICK if args.quick else list(SETTINGS))
    args.settings = {k: SETTINGS[k] for k in chosen}
    return args


def _settings(text: str) -> list[str]:
    names, picked = list(SETTINGS), text.split(",")
    if not all(n.strip().isdigit() and 1 <= int(n) <= len(names) for n in picked):
        raise argparse.ArgumentTypeError(f"expected numbers 1-{len(names)} separated by commas, got {text!r}")
    return [names[int(n) - 1] for n in picked]


def run(name: str, overrides: dict, seed: int, args: argparse.Namespace) -> list[dict]:
    """One ``tiny_moe_mismatch_cpu`` run under the mismatch with ``overrides``; its per-step metrics."""
    slug = name.lower().replace(" + ", "-").replace(", ", "-").replace(" ", "_")
    words = [f"recipe={RECIPE}", f"run.seed={seed}", f"schedule.total_steps={args.steps}", "schedule.eval_every=0",
             *([f"sft.steps={args.sft_steps}"] if args.sft_steps else []),
             *([f"trainer.optimizer.lr={args.lr}"] if args.lr else []),
             *(f"{k}={v}" for k, v in {**MISMATCH, **overrides}.items())]
    return train(args.out, f"{slug}-s{seed}", words, "stability", steps=args.steps)


def summarize(steps: list[dict]) -> dict:
    """First and last ``WINDOW`` steps' reward and correct share, the largest grad norm, the mean k3 KL, the
    per-step correct share, and the verdict."""
    window = min(WINDOW, len(steps))

    def mean(key: str, part: list[dict]) -> float:
        return statistics.fmean(s.get(key, 0.0) for s in part)

    first, last = steps[:window], steps[-window:]
    out = {"reward/first": mean("reward/mean", first), "reward/last": mean("reward/mean", last),
           "correct/first": mean("env/correct", first), "correct/last": mean("env/correct", last),
           "grad_norm/max": max(s.get("policy/grad_norm", 0.0) for s in steps),
           "k3_kl/mean": mean("policy/rollout_train_k3_kl", steps),
           "correct/steps": [s.get("env/correct", 0.0) for s in steps],
           "reward/steps": [s.get("reward/mean", 0.0) for s in steps]}
    drop = out["correct/first"] - out["correct/last"]
    out["verdict"] = ("collapsed" if out["correct/last"] < 0.5 * out["correct/first"]
                      else "drifted" if drop > 0.1 else "held")
    return out


def table(results: dict[str, list[dict]]) -> str:
    """Markdown: one row per setting, medians over seeds, and the verdicts of all seeds."""
    lines = ["| setting | correct, first 5 -> last 5 steps | reward, first 5 -> last 5 | max grad norm "
             "| k3 KL(trainer, sampler) | verdict per seed |", "|---|---|---|---|---|---|"]
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if not isinstance(runs[0][k], (list, str))}
        verdicts = ", ".join(r["verdict"] for r in runs)
        lines.append(f"| {name} | {med['correct/first']:.3f} -> {med['correct/last']:.3f} | {med['reward/first']:.3f} "
                     f"-> {med['reward/last']:.3f} | {med['grad_norm/max']:.3g} | {med['k3_kl/mean']:.2e} | {verdicts} |")
    lines += ["", "Published:", *(f"- {text}" for text in PUBLISHED.values())]
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: Path) -> None:
    """One column per setting: the share of correct answers (top) and the reward (bottom) per step, a line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(3.2 * len(results), 5.6), sharey="row", squeeze=False)
    for column, (name, runs) in enumerate(results.items()):
        for seed, r in enumerate(runs):
            for row, key in enumerate(("correct/steps", "reward/steps")):
                axes[row][column].plot(range(1, len(r[key]) + 1), r[key], label=f"seed {seed}: {r['verdict']}")
        axes[0][column].set(title=name)
        axes[0][column].legend(fontsize=7)
        axes[1][column].set(xlabel="RL step")
    axes[0][0].set_ylabel("correct share (training rollouts)")
    axes[1][0].set_ylabel("reward (training rollouts)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {name: [summarize(run(name, overrides, seed, args)) for seed in range(args.seeds)]
               for name, overrides in args.settings.items()}
    report = {"recipe": RECIPE, "mismatch": MISMATCH, "seeds": args.seeds, "steps": args.steps,
              "sft_steps": args.sft_steps, "lr": args.lr, "published": PUBLISHED, "results": results}
    publish(args.out, "stability", report, lambda path: plot(results, path), table(results))


if __name__ == "__main__":
    main()
