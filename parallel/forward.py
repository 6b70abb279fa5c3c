"""Run micro-batches through megatron's pipeline schedule (any TP/PP/EP), forward-only or with backward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

from parallel.device import device


@dataclass
class MicroBatch:
    """Right-padded rows of one micro-batch and the per-token tensors the loss needs."""

    rows: list[int]
    """Row indices into the full batch (empty for a filler micro-batch)."""
    input_ids: torch.Tensor
    """``[b, s]`` token ids."""
    tensors: dict[str, torch.Tensor | None] = field(default_factory=dict)
    """Per-token ``[b, s]`` tensors (loss mask, advantages, ...), aligned with ``input_ids``."""
    routing: torch.Tensor | None = None
    """Experts to replay, ``[b, s, num_moe_layers, topk]``, or None to route freely."""
    routed: torch.Tensor | None = None
    """``[b, s]`` bool: the positions whose ``routing`` record counts in the disagreement metrics (not padding,
    not a row's last token)."""


def causal_mask(seq_len: int) -> torch.Tensor:
    """``[1, 1, s, s]`` bool, True where attention is masked out (megatron's convention)."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device()), diagonal=1)[None, None]


def attention_mask_for(model, seq_len: int) -> torch.Tensor | None:
    """None when the core attention is the fast spec's SDPA (causal by itself, flash kernels on GPU),
    else the explicit causal mask megatron's local attention needs."""
    from parallel.layers.attention import SDPAttention
    from parallel.weights.placement import unwrap

    layers = unwrap(model).decoder.layers
    if len(layers) and isinstance(layers[0].self_attention.core_attention, SDPAttention):
        return None
    return causal_mask(seq_len)


LossFn = Callable[[MicroBatch, torch.Tensor], tuple[torch.Tensor, dict]]
"""``(micro_batch, output of the last stage) -> (loss, reduced dict)``."""


def run_schedule(
    model,
    micro_batches: list[MicroBatch],
    loss_fn: LossFn,
    *,
    forward_only: bool,
    before_forward: Callable[[MicroBatch], None] | None = None,
    after_forward: Callable[[MicroBatch], None] | None = None,
    pg_collection,
) -> list[dict]:
    """Forward (and backward) every micro-batch; on the last pipeline stage, each loss_fn's dict."""
    seq_len = max(mb.input_ids.shape[1] for mb in micro_batches)
    rows = max(mb.input_ids.shape[0] for mb in micro_batches)

    def forward_step(data_iterator, model_chunk):
        mb = next(data_iterator)
        ids = mb.input_ids.to(device())
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        if before_forward is not None:
            before_forward(mb)
        output = model_chunk(ids, positions, attention_mask_for(model_chunk, ids.shape[1]))
        if after_forward is not None:
            after_forward(mb)
        return output, lambda out: loss_fn(mb, out)

    pp = pg_collection.pp
    extra = {}
    if pp.size() > 1:
        extra["p2p_communicator"] = P2PCommunicator(pp_group=pp, config=model_config(model))
    results = get_forward_backward_func(pp_size=pp.size())(
        forward_step_func=forward_step,
        data_iterator=iter(micro_batches),
        model=[model],
        num_microbatches=len(micro_batches),
        seq_length=seq_len,
        micro_batch_size=rows,
        forward_only=forward_only,
        pg_collection=pg_collection,
        **extra,
    )
    release_dispatcher_state(model)
    return results


def release_dispatcher_state(model) -> None:
    """Drop the routing probabilities megatron's MoE token dispatchers keep from the last forward.

    A dispatcher holds ``probs`` (with its autograd graph) until the next forward. Under activation
    recompute that graph is the one rebuilt inside backward, and it keeps the layer's recomputed inputs
    alive between steps (CPU, 4-layer MoE, full recompute: all 34 MB that outlived a step)."""
    for module in model.modules():
        dispatcher = getattr(module, "token_dispatcher", None)
        if getattr(dispatcher, "probs", None) is not None:
            dispatcher.probs = None


def model_config(model):
    """The TransformerConfig of a (possibly wrapped) megatron model."""
    from megatron.core.utils import get_model_config

    return get_model_config(model)
