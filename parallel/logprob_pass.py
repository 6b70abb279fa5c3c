"""The log-prob pass: per-token log-probs and entropy of a batch's own tokens, for every row."""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_rl.contracts import TrainingBatch
from parallel.batching import micro_batches
from parallel.device import device
from parallel.forward import MicroBatch, run_schedule
from parallel.logprobs import vocab_parallel_logprobs
from parallel.routing import RoutingReplay, gather_records


def token_logprobs(mb: MicroBatch, logits: torch.Tensor, tp_group, with_entropy: bool = True, temperature: float = 1.0):
    """``[b, s]`` log p(token t | tokens < t) and entropy at t (0 at position 0), of ``softmax(logits / temperature)``:
    the distribution the rows were sampled from (``TrainingBatch.temperature``)."""
    ids = mb.input_ids.to(logits.device)
    logits = logits[:, :-1] if temperature == 1.0 else logits[:, :-1] / temperature
    logp, ent = vocab_parallel_logprobs(logits, ids[:, 1:], tp_group, with_entropy)
    pad = lambda x: None if x is None else torch.nn.functional.pad(x, (1, 0))  # noqa: E731
    return pad(logp), pad(ent)


def _scatter_rows(results, shape) -> tuple[torch.Tensor, torch.Tensor]:
    logp, ent = torch.zeros(shape, device=device()), torch.zeros(shape, device=device())
    for rows, lp, en in results:
        if rows:
            logp[rows, : lp.shape[1]] = lp
            ent[rows, : en.shape[1]] = en
    return logp, ent


@torch.no_grad()
def compute_logprobs(
    model, batch: TrainingBatch, max_tokens: int, pg_collection, routing: RoutingReplay | None = None, mode: str = "free"
):
    """(log-probs, entropy, routed experts or None); tensors ``[B, T]`` float32 on CPU, zero on padding.

    ``mode``: ``free`` routes freely, ``replay`` replays ``batch.routed_experts``, ``record`` routes
    freely and returns each row's experts (R2's old-log-prob pass). Every rank returns the whole
    batch: rows are reduced over data-parallel ranks and sent from the last pipeline stage.
    """
    pgs = pg_collection
    model.eval()
    mbs = micro_batches(batch, max_tokens, pgs.dp.rank(), pgs.dp.size())
    results, records = [], []
    before = after = None
    if mode == "replay":
        before = routing.replay
    elif mode == "record":
        before = routing.record
        after = lambda mb: records.append((mb.rows, routing.recorded(mb)))  # noqa: E731

    def collect(mb, logits):
        lp, en = token_logprobs(mb, logits, pgs.tp, temperature=batch.temperature)
        results.append((mb.rows, lp, en))
        return logits.new_zeros(()), {}

    try:
        run_schedule(model, mbs, collect, forward_only=True, before_forward=before, after_forward=after, pg_collection=pgs)
    finally:
        if routing is not None:
            routing.off()
    routed = gather_records(records, batch, routing, pgs) if mode == "record" else None
    logp, ent = _scatter_rows(results, tuple(batch.input_ids.shape))
    both = torch.stack([logp, ent])
    if pgs.dp.size() > 1:
        dist.all_reduce(both, group=pgs.dp)
    if pgs.pp.size() > 1:
        last = dist.get_global_rank(pgs.pp, pgs.pp.size() - 1)
        dist.broadcast(both, src=last, group=pgs.pp)
    both = both * batch.attention_mask.to(both.device)
    return both[0].cpu(), both[1].cpu(), routed
