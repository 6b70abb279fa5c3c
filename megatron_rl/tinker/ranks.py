"""What the service runs on every trainer rank (``WorkerGroup.run``): forward/backward that
accumulates gradients across calls, and the optimizer step with the request's Adam parameters.

Gradients live in megatron's DDP buffers from one ``forward_backward`` to the next and are cleared by
``optim_step``; ``scratch["dirty"]`` says the buffers hold gradients not yet stepped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.loss import policy_update_loss
from megatron_rl.contracts import TrainingBatch
from megatron_rl.tinker.losses import TINKER_LOSSES, algorithm_for, tinker_token_loss


def _gather_rows(results, shape, pgs) -> torch.Tensor:
    """``[2, B, T]`` (log-probs, per-token loss) of every row, on every rank."""
    from parallel.device import device

    both = torch.zeros((2, *shape), device=device())
    for rows, lp, el in results:
        both[0, rows, : lp.shape[1]] = lp
        both[1, rows, : el.shape[1]] = el
    if pgs.dp.size() > 1:
        dist.all_reduce(both, group=pgs.dp)
    if pgs.pp.size() > 1:
        dist.broadcast(both, src=dist.get_global_rank(pgs.pp, pgs.pp.size() - 1), group=pgs.pp)
    return both.cpu()


def forward_backward(policy, scratch, batch: TrainingBatch, loss_fn: str, config: dict, forward_only: bool):
    """Run the batch; unless ``forward_only``, add d(loss)/d(weights) to the gradient buffers.

    Returns (log-probs ``[B, T]``, per-token loss ``[B, T]`` (zeros for the registered losses), the
    loss, metrics). Tinker's losses are sums over tokens; the registered ones aggregate as their
    ``loss_agg_mode`` says over the whole request.
    """
    from parallel.batching import micro_batches
    from parallel.forward import run_schedule
    from parallel.logprob_pass import token_logprobs
    from parallel.train_step import aggregation_unit

    pgs, model = policy.pgs, policy.model
    algo: AlgorithmConfig | None = None if loss_fn in TINKER_LOSSES else algorithm_for(loss_fn, config, policy.algorithm)
    if not forward_only and not scratch.get("dirty"):
        model.zero_grad_buffer()
        policy.optimizer.zero_grad()
    model.train() if not forward_only else model.eval()
    mbs = micro_batches(batch, policy.cfg.max_tokens_per_micro_batch, pgs.dp.rank(), pgs.dp.size())
    undo = len(mbs) * pgs.dp.size()  # the schedule divides by micro-batches and DDP averages over ranks
    total = aggregation_unit(batch.loss_mask, algo.loss_agg_mode).clamp(min=1) if algo else None
    results = []

    def loss(mb, logits):
        logp, _ = token_logprobs(mb, logits, pgs.tp, with_entropy=False, temperature=batch.temperature)
        if not mb.rows:
            return (logp * 0).sum(), {}
        t = {k: (v.to(logits.device) if v is not None else None) for k, v in mb.tensors.items()}
        mask = t["loss_mask"]
        if algo is None:
            token = tinker_token_loss(loss_fn, logp, t["rollout_logprobs"], t["advantages"], config) * mask
            value, metrics = token.sum(), {}
        else:
            share = float(aggregation_unit(mask, algo.loss_agg_mode) / total)
            old = t["old_logprobs"] if t["old_logprobs"] is not None else logp.detach()
            value, metrics = policy_update_loss(logp, old, t["advantages"], mask, algo, rollout_logprobs=t["rollout_logprobs"])
            value = value * share
            metrics = {k: v.detach().float() * share for k, v in metrics.items()}
            token = torch.zeros_like(logp)
        results.append((mb.rows, logp.detach(), token.detach()))
        metrics["loss"] = value.detach()
        return value * undo, metrics

    per_mb = run_schedule(model, mbs, loss, forward_only=forward_only, pg_collection=pgs)
    if not forward_only:
        scratch["dirty"] = True
    both = _gather_rows(results, tuple(batch.input_ids.shape), pgs)
    keys = sorted({k for d in per_mb for k in d})
    sums = {k: float(sum(float(d.get(k, 0.0)) for d in per_mb)) for k in keys}
    return both[0], both[1], sums


def optim_step(policy, scratch, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
               grad_clip_norm: float) -> dict[str, float]:
    """One Adam step with these hyperparameters on the gradients accumulated since the last step."""
    if not scratch.get("dirty"):
        raise ValueError("optim_step: no forward_backward since the last step; there are no gradients to apply")
    opt = policy.optimizer
    for inner in getattr(opt, "chained_optimizers", [opt]):
        inner.config.clip_grad = grad_clip_norm
        for group in inner.optimizer.param_groups:
            group["lr"], group["betas"], group["eps"] = lr * group.get("lr_mult", 1.0), (beta1, beta2), eps
            group["weight_decay"] = weight_decay * group.get("wd_mult", 1.0)
    ok, grad_norm, _ = opt.step()
    if not ok:
        raise RuntimeError("optim_step: skipped (non-finite gradients)")
    policy.model.zero_grad_buffer()
    opt.zero_grad()
    scratch["dirty"] = False
    policy.steps += 1
    return {"grad_norm": float(grad_norm) if grad_norm is not None else 0.0, "step": float(policy.steps)}


def save_hf(policy, scratch, path: str) -> str:
    return str(policy.save_hf(path))


def reset_optimizer(policy, scratch) -> None:
    """Fresh Adam state (``load_state`` without the optimizer)."""
    from parallel.optim import build_optimizer

    policy.optimizer, policy.scheduler = build_optimizer(policy.model, policy.cfg, policy.pgs)
    scratch["dirty"] = False


def load_base(policy, scratch) -> None:
    """The source checkpoint's weights, a fresh Adam and step 0: where a newly created model starts."""
    from parallel.weights.hf_import import load_hf_weights

    load_hf_weights(policy.model, policy.hf_dir, policy.pgs)
    reset_optimizer(policy, scratch)
    policy.steps = 0


def pending_gradients(policy, scratch) -> bool:
    """Whether the gradient buffers hold a ``forward_backward`` that no ``optim_step`` has applied."""
    return bool(scratch.get("dirty"))
