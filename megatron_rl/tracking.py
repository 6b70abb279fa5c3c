"""Where step metrics go: the run folder's metrics.jsonl, one console line, W&B when configured, a PNG."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from megatron_rl.console import StepClock
from megatron_rl.env_vars import wandb_mode
from megatron_rl.run_folder import RunFolder

log = logging.getLogger("megatron_rl")

# The few numbers a person watches, in console order.
_CONSOLE = (
    ("sft/loss", "sft_loss", "{:.4f}"),
    ("reward/mean", "reward", "{:.3f}"),
    ("env/correct", "correct", "{:.3f}"),
    ("eval/pass_rate", "eval_pass", "{:.3f}"),
    ("eval/reward_mean", "eval_reward", "{:.3f}"),
    ("generate/response_length", "resp_len", "{:.1f}"),
    ("policy/entropy", "entropy", "{:.2f}"),
    ("policy/loss", "loss", "{:.4f}"),
    ("timing/step", "step_s", "{:.1f}"),
)
# curves.png: one panel each, (metric, title); a panel with no points says so.
PANELS = (
    ("reward/mean", "train reward"),
    ("eval/pass_rate", "eval pass rate (held-out)"),
    ("generate/response_length", "response length (tokens)"),
    ("policy/entropy", "entropy (nats/token)"),
    ("policy/kl", "KL to reference"),
    ("policy/rollout_train_k3_kl_first", "rollout/trainer mismatch (k3 KL, first step)"),
)


class Tracker:
    """Logs each step's metrics everywhere a run reports them, and times the run's phases."""

    def __init__(self, folder: RunFolder, run_name: str, wandb_project: str, config: dict, total_steps: int = 0):
        self.folder = folder
        self.clock = StepClock(total_steps)
        self.phases: dict[str, float] = {}
        self._wandb = None
        if wandb_project:
            import wandb

            self._wandb = wandb.init(project=wandb_project, name=run_name, config=config, mode=wandb_mode(),
                                     dir=str(folder.root))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.folder.log_metrics(step, metrics)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        shown = " ".join(f"{label}={fmt.format(metrics[key])}" for key, label, fmt in _CONSOLE if key in metrics)
        log.info("step %s %s", self.clock.tag(step), shown)

    def log_sft(self, step: int, metrics: dict[str, float]) -> None:
        """SFT warm-start progress: console only (RL steps own metrics.jsonl's step axis)."""
        check = (f" check_pass={metrics['sft/check_pass_rate']:.3f} (at step {metrics['sft/check_step']:.0f})"
                 if "sft/check_pass_rate" in metrics else "")
        log.info("sft step %d loss=%.4f entropy=%.2f lr=%.2e%s", step, metrics.get("sft/loss", float("nan")),
                 metrics.get("sft/entropy", float("nan")), metrics.get("sft/lr", float("nan")), check)

    @contextlib.contextmanager
    def phase(self, name: str):
        """``with tracker.phase("sft"):`` adds the block's wall seconds to ``phases[name]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start

    def finish(self) -> Path:
        """Write ``curves.png`` and close W&B."""
        path = plot_curves(self.folder.read_metrics(), self.folder.root / "curves.png")
        if self._wandb is not None:
            self._wandb.finish()
        return path


def plot_curves(records: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    for ax, (key, title) in zip(axes.flat, PANELS):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3)
        else:
            ax.text(0.5, 0.5, f"not measured\n({key})", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
