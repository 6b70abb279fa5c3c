"""One rank of the Megatron policy: model, optimizer and schedule, with the calls the loop needs.

Ray actors (``parallel.worker_group``) and the multi-process tests both drive this class.
"""

from __future__ import annotations

from pathlib import Path

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.contracts import TrainingBatch
from parallel.config import TrainerConfig


class MegatronPolicy:
    """This rank's shard of the policy. Build on every rank of the job, then call methods on all ranks."""

    def __init__(self, hf_dir: str | Path, cfg: TrainerConfig, algorithm: AlgorithmConfig, rank: int, world_size: int, init_method: str):
        from parallel import cpu_compat

        cpu_compat.enable()
        from parallel.groups import init_distributed
        from parallel.optim import build_optimizer, wrap_ddp
        from parallel.provider import build_model
        from parallel.weights.hf_import import load_hf_weights

        self.cfg, self.algorithm, self.hf_dir = cfg, algorithm, str(hf_dir)
        self.pgs = init_distributed(cfg.parallel, rank, world_size, init_method)
        model = build_model(hf_dir, cfg, self.pgs)
        load_hf_weights(model, hf_dir, self.pgs)
        self.model = wrap_ddp(model, cfg, self.pgs)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, self.pgs)
        self.steps = 0

    def compute_logprobs(self, batch: TrainingBatch):
        """(log-probs, entropy) ``[B, T]`` of the batch's tokens under the current weights."""
        from parallel.logprob_pass import compute_logprobs

        return compute_logprobs(self.model, batch, self.cfg.max_tokens_per_micro_batch, self.pgs)

    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One optimizer step on the batch; metrics (meaningful on the last pipeline stage)."""
        from parallel.train_step import train_step

        metrics = train_step(
            self.model, self.optimizer, self.scheduler, batch, self.algorithm, self.cfg.max_tokens_per_micro_batch, self.pgs
        )
        self.steps += 1
        return metrics

    def export_weights(self):
        """(HF name, tensor) pairs this rank owns; every rank must consume its iterator."""
        from parallel.weights.hf_export import iter_hf_weights

        return iter_hf_weights(self.model, self.pgs)
