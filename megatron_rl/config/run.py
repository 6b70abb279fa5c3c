"""Run identity and output: where a run writes, its seed, and whether it resumes."""

from dataclasses import dataclass


@dataclass
class RunConfig:
    """``run.*``: identity and output folder of a run."""

    name: str = "tiny_cpu"
    """Run name; the run folder is ``<output_dir>/<name>``."""
    output_dir: str = "outputs"
    """Parent folder of run folders."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    resume: str = "none"
    """``none`` starts fresh (refusing a run folder that already has steps); ``latest`` continues."""
    wandb_project: str = ""
    """W&B project; empty disables W&B (metrics.jsonl is always written)."""
    verbose: bool = False
    """Show every warning of every process (third-party notices are filtered from the console otherwise)."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"run.name: {self.name!r} must be a non-empty folder name without '/'")
        if self.resume not in ("none", "latest"):
            raise ValueError(f"run.resume: {self.resume!r} is not one of none, latest")
