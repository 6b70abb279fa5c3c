"""One rank of the Megatron policy: model, optimizer and schedule, with the calls the loop needs.

Ray actors (``parallel.worker_group``) and the multi-process tests both drive this class.
"""

from __future__ import annotations

from pathlib import Path

from correction.routing_replay import RoutingReplayMode
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
        from parallel.provider import load_model
        from parallel.routing import RoutingReplay

        self.cfg, self.algorithm, self.hf_dir = cfg, algorithm, str(hf_dir)
        self.pgs = init_distributed(cfg.parallel, rank, world_size, init_method)
        model = load_model(hf_dir, cfg, self.pgs)
        self.model = wrap_ddp(model, cfg, self.pgs)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, self.pgs)
        self.routing = RoutingReplay(self.model) if model.config.num_moe_experts else None
        self.steps = 0
        self._export = None  # planned at the first export_weights

    def _replaying(self, batch: TrainingBatch, algorithm: AlgorithmConfig | None = None) -> bool:
        mode = (algorithm or self.algorithm).routing_replay.mode
        if RoutingReplayMode(mode).value == "none" or self.routing is None:
            return False
        if batch.routed_experts is None:
            raise ValueError(
                f"algorithm.routing_replay.mode={mode.value} but the batch has no routed experts "
                "(r3: the sampler must return them; r2: pass the old-log-prob pass's record)"
            )
        return True

    def compute_logprobs(self, batch: TrainingBatch, record_routing: bool = False):
        """(log-probs, entropy, routed experts) of the batch's tokens under the current weights.

        ``record_routing`` (R2's old-log-prob pass) routes freely and returns each row's experts;
        otherwise the batch's routed experts are replayed when routing replay is on.
        """
        from parallel.logprob_pass import compute_logprobs

        if record_routing and self.routing is None:
            raise ValueError("compute_logprobs(record_routing=True) needs an MoE model")
        mode = "record" if record_routing else "replay" if self._replaying(batch) else "free"
        return compute_logprobs(self.model, batch, self.cfg.max_tokens_per_micro_batch, self.pgs, self.routing, mode)

    def train_step(self, batch: TrainingBatch, algorithm: AlgorithmConfig | None = None,
                   lr: float | None = None) -> dict[str, float]:
        """One optimizer step on the batch; metrics (meaningful on the last pipeline stage).

        ``algorithm`` replaces the policy's own for this step (the SFT warm start's cross-entropy); ``lr`` runs
        the step at that constant rate and leaves the trainer's schedule where it was (the warm start's own rate).
        """
        from parallel.optim import ConstantRate
        from parallel.train_step import train_step

        algorithm = algorithm or self.algorithm
        scheduler = self.scheduler if lr is None else ConstantRate(self.optimizer, lr)
        scheduler.step(increment=0)  # this step's rate: the schedule resumes after steps at a rate of their own
        metrics = train_step(
            self.model, self.optimizer, scheduler, batch, algorithm, self.cfg.max_tokens_per_micro_batch,
            self.pgs, self.routing if self._replaying(batch, algorithm) else None,
        )
        self.steps += 1
        return metrics

    def save(self, path: str | Path) -> None:
        """Write model, optimizer, LR schedule, RNG and step count into ``path`` (collective: all ranks).

        ``path`` is filled completely or RuntimeError is raised; atomic publishing (temp folder,
        rename, tracker) is the caller's (``megatron_rl.checkpoint.save_checkpoint``).
        """
        from parallel.dist_checkpoint import save_trainer

        save_trainer(path, self.model, self.optimizer, self.scheduler, self.pgs, {"steps": self.steps})

    def load(self, path: str | Path) -> None:
        """Restore what :meth:`save` wrote, also from another TP/PP/EP/DP layout (collective)."""
        from parallel.dist_checkpoint import load_trainer

        self.steps = int(load_trainer(path, self.model, self.optimizer, self.scheduler, self.pgs)["steps"])

    def memory(self) -> dict[str, int]:
        """This rank's bytes: params, grads, optimizer, rss; on GPU also cuda_allocated and cuda_peak."""
        from parallel.memory import memory_report

        return memory_report(self.model, self.optimizer)

    def save_hf(self, path: str | Path) -> Path:
        """Write the current weights as an HF checkpoint (safetensors per rank + index, config and
        tokenizer from the source directory) that ``AutoModelForCausalLM.from_pretrained`` loads."""
        from parallel.weights.hf_save import save_hf_checkpoint

        return save_hf_checkpoint(self.model, self.pgs, path, self.hf_dir)

    def export_weights(self, row_blocks: bool = False):
        """(HF name, tensor) pairs this rank owns; every rank must consume its iterator. ``row_blocks``: see
        :meth:`parallel.weights.hf_export.HFExport.tensors` (weight transfers pass True)."""
        from parallel.weights.hf_export import HFExport

        if self._export is None:
            self._export = HFExport(self.model, self.pgs)
        return self._export.tensors(row_blocks)
