"""TrainingBatch -> this rank's micro-batches (its data-parallel share, within the token budget)."""

from __future__ import annotations

import torch

from megatron_rl.contracts import TrainingBatch
from parallel.forward import MicroBatch
from parallel.microbatch import plan

PER_TOKEN = ("attention_mask", "loss_mask", "advantages", "rollout_logprobs", "old_logprobs", "ref_logprobs")


def row_lengths(batch: TrainingBatch) -> list[int]:
    """Real (unpadded) tokens per row."""
    return batch.attention_mask.sum(dim=1).long().tolist()


def _filler() -> MicroBatch:
    """One masked-out token: keeps collectives in step on a rank with no rows left."""
    zeros = torch.zeros(1, 1)
    return MicroBatch(rows=[], input_ids=torch.zeros(1, 1, dtype=torch.long), tensors={"loss_mask": zeros})


def _stack_routing(batch: TrainingBatch, rows: list[int], width: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The micro-batch's experts to replay ``[b, s, L, k]`` and the positions whose record counts ``[b, s]``: all
    but a row's last, which the sampler never forwards (its record repeats the one before, and its logits
    are read by no loss)."""
    records = batch.routed_experts
    if records is None:
        return None, None
    picked = [records[r] for r in rows]
    if any(r is None for r in picked):
        missing = next(batch.trajectory_ids[r] for r, rec in zip(rows, picked) if rec is None)
        raise ValueError(f"routing replay: trajectory {missing} has no routed experts while others do")
    layers, topk = picked[0].num_moe_layers, picked[0].topk
    # Padding positions route to experts 0..topk-1 (distinct, so the dispatcher accepts them).
    out = torch.arange(topk).expand(len(rows), width, layers, topk).clone()
    recorded = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, rec in enumerate(picked):
        n = min(rec.num_tokens, width)
        out[i, :n] = rec.indices[:n].long()
        recorded[i, : n - 1] = True
    return out, recorded


def micro_batches(batch: TrainingBatch, max_tokens: int, dp_rank: int, dp_size: int) -> list[MicroBatch]:
    """This data-parallel rank's micro-batches, each trimmed to its longest row."""
    out = []
    for rows in plan(row_lengths(batch), max_tokens, dp_size)[dp_rank]:
        if not rows:
            out.append(_filler())
            continue
        sub = batch.select(rows)
        tensors = {name: getattr(sub, name) for name in PER_TOKEN}
        width = sub.input_ids.shape[1]
        out.append(MicroBatch(rows, sub.input_ids, tensors, *_stack_routing(batch, rows, width)))
    return out
