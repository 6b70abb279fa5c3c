"""One policy update over a TrainingBatch: micro-batches, policy loss, accumulation, clip, step."""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.loss import policy_update_loss
from megatron_rl.algorithms.mismatch import rollout_mismatch
from megatron_rl.contracts import TrainingBatch
from parallel.batching import micro_batches
from parallel.device import device
from parallel.forward import MicroBatch, run_schedule
from parallel.logprob_pass import token_logprobs

_SEQUENCE_MODES = ("seq-mean-token-sum", "seq-mean-token-mean")


def aggregation_unit(loss_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """How much of the batch's loss a set of rows carries: live tokens, live rows, or rows.

    A micro-batch's aggregated loss times its share (its units / the batch's units) sums to the
    loss of the whole batch aggregated at once.
    """
    if mode == "token-mean":
        return loss_mask.sum()
    if mode in _SEQUENCE_MODES:
        return (loss_mask.sum(dim=-1) > 0).sum()
    return torch.tensor(float(loss_mask.shape[0]))


def _micro_batch_loss(mb: MicroBatch, logits, algo: AlgorithmConfig, tp_group, share: float, temperature: float):
    t = {k: (v.to(logits.device) if v is not None else None) for k, v in mb.tensors.items()}
    mask = t["loss_mask"]
    logp, ent = token_logprobs(mb, logits, tp_group, with_entropy=True, temperature=temperature)
    if not mb.rows:  # filler: keeps collectives in step, contributes nothing
        return (logp * 0).sum(), {}
    old = t["old_logprobs"] if t["old_logprobs"] is not None else logp.detach()
    loss, metrics = policy_update_loss(
        logp,
        old,
        t["advantages"],
        mask,
        algo,
        rollout_logprobs=t["rollout_logprobs"],
        ref_log_probs=t["ref_logprobs"],
        entropy=ent if algo.entropy_coeff > 0 else None,
    )
    metrics["policy/entropy"] = (ent.detach() * mask).sum() / mask.sum().clamp(min=1)
    metrics.update(rollout_mismatch(logp.detach(), t["rollout_logprobs"], mask))
    metrics["perf/loss_tokens"] = mask.sum()
    weighted = {k: v.detach().float() * share for k, v in metrics.items() if k != "perf/loss_tokens"}
    weighted["perf/loss_tokens"] = metrics["perf/loss_tokens"]
    return loss * share, weighted


def _reduce_metrics(per_mb: list[dict], pg_collection) -> dict[str, float]:
    keys = sorted({k for d in per_mb for k in d})
    if not keys:
        return {}
    sums = torch.stack([sum(d.get(k, torch.zeros(())).to(device()) for d in per_mb) for k in keys]).float()
    if pg_collection.dp.size() > 1:
        dist.all_reduce(sums, group=pg_collection.dp)
    return dict(zip(keys, sums.tolist()))


def train_step(
    model, optimizer, scheduler, batch: TrainingBatch, algo: AlgorithmConfig, max_tokens: int, pg_collection, routing=None
) -> dict[str, float]:
    """Accumulate gradients over this rank's micro-batches, clip, step; metrics on the last stage.

    With ``routing`` (a RoutingReplay), every micro-batch replays ``batch.routed_experts`` and the metrics
    gain how often the routers' own choice differed (``RoutingReplay.disagreement``).
    """
    pgs = pg_collection
    model.train()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    mbs = micro_batches(batch, max_tokens, pgs.dp.rank(), pgs.dp.size())
    total = aggregation_unit(batch.loss_mask, algo.loss_agg_mode).clamp(min=1)
    # The schedule divides each loss by the number of micro-batches and DDP averages over
    # data-parallel ranks; both are undone so the gradient is that of the whole batch's loss.
    undo = len(mbs) * pgs.dp.size()

    def loss_fn(mb, logits):
        mask = mb.tensors["loss_mask"]
        share = float(aggregation_unit(mask, algo.loss_agg_mode) / total) if mb.rows else 0.0
        loss, metrics = _micro_batch_loss(mb, logits, algo, pgs.tp, share, batch.temperature)
        return loss * undo, metrics

    before, after = (routing.replay, routing.replayed) if routing is not None else (None, None)
    try:
        per_mb = run_schedule(
            model, mbs, loss_fn, forward_only=False, before_forward=before, after_forward=after, pg_collection=pgs
        )
        routed = routing.disagreement(batch, pgs) if routing is not None else {}
    finally:
        if routing is not None:
            routing.off()
    lr = float(optimizer.param_groups[0]["lr"])  # the rate this step runs at, before the schedule moves on
    ok, grad_norm, _ = optimizer.step()
    if not ok:
        raise RuntimeError("trainer: optimizer step skipped (non-finite gradients)")
    scheduler.step(increment=1)
    metrics = _reduce_metrics(per_mb, pgs)
    metrics["policy/grad_norm"] = float(grad_norm) if grad_norm is not None else 0.0
    metrics["policy/lr"] = lr
    metrics["perf/tokens"] = float(batch.num_tokens)
    metrics["perf/micro_batches"] = float(len(mbs))
    return metrics | routed
