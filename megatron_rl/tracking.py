"""Where step metrics go: the run folder's metrics.jsonl, one console line, W&B when configured, a PNG."""

from __future__ import annotations

import logging
from pathlib import Path

from megatron_rl.env_vars import wandb_mode
from megatron_rl.run_folder import RunFolder

log = logging.getLogger("megatron_rl")

# The few numbers a person watches, in console order.
_CONSOLE = (
    ("reward/mean", "reward", "{:.3f}"),
    ("eval/reward_mean", "eval", "{:.3f}"),
    ("generate/response_length", "resp_len", "{:.1f}"),
    ("policy/loss", "loss", "{:.4f}"),
    ("timing/generate", "gen_s", "{:.1f}"),
    ("timing/train", "train_s", "{:.1f}"),
    ("timing/weight_sync", "sync_s", "{:.2f}"),
    ("timing/step", "step_s", "{:.1f}"),
)


class Tracker:
    """Logs each step's metrics everywhere a run reports them."""

    def __init__(self, folder: RunFolder, run_name: str, wandb_project: str, config: dict):
        self.folder = folder
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
        log.info("step %d %s", step, shown)

    def log_sft(self, step: int, metrics: dict[str, float]) -> None:
        """SFT warm-start progress: console only (RL steps own metrics.jsonl's step axis)."""
        shown = " ".join(f"{k.split('/')[-1]}={v:.4g}" for k, v in sorted(metrics.items()))
        log.info("sft step %d %s", step, shown)

    def finish(self) -> Path:
        """Write ``curves.png`` (training and eval reward by step) and close W&B."""
        path = plot_rewards(self.folder.read_metrics(), self.folder.root / "curves.png")
        if self._wandb is not None:
            self._wandb.finish()
        return path


def plot_rewards(records: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("reward/mean", "train reward"), ("eval/reward_mean", "eval reward")):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
