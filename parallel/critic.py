"""The critic: the policy's model with a scalar value head, its value forward and clipped-loss update.

Built by the same provider from the policy's HF checkpoint (so it starts from the policy's weights),
with the vocabulary output layer replaced on the last pipeline stage by :class:`ValueHead`, a
``[1, hidden]`` projection replicated on every tensor-parallel rank (its input, the final hidden
state, is replicated too). Values are ``[B, T]`` and aligned like log-probs: position ``p`` holds the
value of the state before token ``p`` (the head's output at ``p - 1``, which has not seen the token),
so a response token's value, log-prob and advantage share one position.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core.transformer.module import MegatronModule

from megatron_rl.contracts import TrainingBatch
from parallel.batching import micro_batches
from parallel.config import CriticConfig, TrainerConfig
from parallel.device import device
from parallel.forward import run_schedule
from parallel.value_loss import clipped_value_loss
from parallel.weights.placement import unwrap


class ValueHead(MegatronModule):
    """``hidden [s, b, h] -> values [s, b, 1]``; called like megatron's output layer."""

    def __init__(self, config, init_std: float):
        super().__init__(config=config)
        self.weight = torch.nn.Parameter(torch.zeros(1, config.hidden_size, dtype=config.params_dtype, device=device()))
        if init_std > 0:
            torch.nn.init.normal_(self.weight, std=init_std)
        self.sequence_parallel = False

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        return torch.nn.functional.linear(hidden, self.weight), None


def attach_value_head(model, init_std: float) -> None:
    """Replace the last stage's vocabulary output layer by a :class:`ValueHead` (before DDP wrapping)."""
    gpt = unwrap(model)
    if gpt.post_process:
        gpt.output_layer = ValueHead(gpt.config, init_std)


def state_values(head_out: torch.Tensor) -> torch.Tensor:
    """``[b, s]`` head outputs -> ``[b, s]`` values of the state before each token (0 at position 0)."""
    return torch.nn.functional.pad(head_out[:, :-1], (1, 0))


def _micro_batches(batch: TrainingBatch, max_tokens: int, pgs, **per_token: torch.Tensor):
    """This rank's micro-batches with extra ``[B, T]`` tensors cut to each micro-batch's rows."""
    mbs = micro_batches(batch, max_tokens, pgs.dp.rank(), pgs.dp.size())
    for mb in mbs:
        width = mb.input_ids.shape[1]
        for name, full in per_token.items():
            mb.tensors[name] = full[mb.rows, :width] if mb.rows else torch.zeros(1, 1)
    return mbs


@torch.no_grad()
def compute_values(model, batch: TrainingBatch, max_tokens: int, pgs) -> torch.Tensor:
    """``[B, T]`` float32 values on CPU, zero on padding; every rank returns the whole batch."""
    model.eval()
    out = torch.zeros(tuple(batch.input_ids.shape), device=device())

    def collect(mb, values):
        if mb.rows:
            out[mb.rows, : values.shape[1]] = state_values(values[..., 0].float())
        return values.new_zeros(()), {}

    run_schedule(model, _micro_batches(batch, max_tokens, pgs), collect, forward_only=True, pg_collection=pgs)
    if pgs.dp.size() > 1:
        dist.all_reduce(out, group=pgs.dp)
    if pgs.pp.size() > 1:
        dist.broadcast(out, src=dist.get_global_rank(pgs.pp, pgs.pp.size() - 1), group=pgs.pp)
    return (out * batch.attention_mask.to(out.device)).cpu()


def critic_train_step(model, optimizer, scheduler, batch, returns, old_values, clip, max_tokens, pgs) -> dict[str, float]:
    """One optimizer step on the clipped value loss over the batch's loss tokens (token mean)."""
    model.train()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    mbs = _micro_batches(batch, max_tokens, pgs, returns=returns, old_values=old_values)
    total = batch.loss_mask.sum().clamp(min=1)
    undo = len(mbs) * pgs.dp.size()  # the schedule averages over micro-batches, DDP over DP ranks

    def loss_fn(mb, values):
        t = {k: v.to(values.device) for k, v in mb.tensors.items() if v is not None}
        predicted = state_values(values[..., 0].float())
        loss, metrics = clipped_value_loss(predicted, t["old_values"], t["returns"], t["loss_mask"], clip)
        share = float(t["loss_mask"].sum() / total) if mb.rows else 0.0
        return loss * share * undo, {k: v * share for k, v in metrics.items()}

    per_mb = run_schedule(model, mbs, loss_fn, forward_only=False, pg_collection=pgs)
    ok, grad_norm, _ = optimizer.step()
    if not ok:
        raise RuntimeError("critic: optimizer step skipped (non-finite gradients)")
    scheduler.step(increment=1)
    metrics = {k: float(sum(d[k] for d in per_mb)) for k in (per_mb[0] if per_mb else {})}
    metrics["critic/grad_norm"] = float(grad_norm) if grad_norm is not None else 0.0
    return metrics


class MegatronCritic:
    """This rank's shard of the value model. Build on every rank, then call methods on all ranks.

    ``pgs``: the process groups when the policy already initialised them in this process.
    """

    def __init__(self, hf_dir: str | Path, cfg: TrainerConfig, critic: CriticConfig, rank: int, world_size: int,
                 init_method: str, pgs=None):
        from parallel import cpu_compat

        cpu_compat.enable()
        from parallel.groups import init_distributed
        from parallel.optim import build_optimizer, wrap_ddp
        from parallel.provider import load_model

        self.cfg, self.critic, self.hf_dir, self.steps = cfg, critic, str(hf_dir), 0
        self.pgs = pgs or init_distributed(cfg.parallel, rank, world_size, init_method)
        model = load_model(hf_dir, cfg, self.pgs)
        attach_value_head(model, critic.head_init_std)
        self.model = wrap_ddp(model, cfg, self.pgs)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, self.pgs)

    def compute_values(self, batch: TrainingBatch) -> torch.Tensor:
        """``[B, T]`` values of every token's state under the current weights."""
        return compute_values(self.model, batch, self.cfg.max_tokens_per_micro_batch, self.pgs)

    def train_step(self, batch: TrainingBatch, returns: torch.Tensor, old_values: torch.Tensor) -> dict[str, float]:
        """One update toward ``returns`` ``[B, T]``, clipped around ``old_values`` (metrics on the last stage)."""
        if returns.shape != batch.loss_mask.shape or old_values.shape != batch.loss_mask.shape:
            raise ValueError(f"critic.train_step: returns and old_values must be {tuple(batch.loss_mask.shape)}")
        metrics = critic_train_step(
            self.model, self.optimizer, self.scheduler, batch, returns, old_values, self.critic.value_clip,
            self.cfg.max_tokens_per_micro_batch, self.pgs,
        )
        self.steps += 1
        return metrics

    def save(self, path: str | Path) -> None:
        """Collective; as :meth:`parallel.policy.MegatronPolicy.save`."""
        from parallel.dist_checkpoint import save_trainer

        save_trainer(path, self.model, self.optimizer, self.scheduler, self.pgs, {"steps": self.steps})

    def load(self, path: str | Path) -> None:
        """Collective; as :meth:`parallel.policy.MegatronPolicy.load`."""
        from parallel.dist_checkpoint import load_trainer

        self.steps = int(load_trainer(path, self.model, self.optimizer, self.scheduler, self.pgs)["steps"])
