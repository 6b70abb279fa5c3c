"""Per-GPU memory of a trainer rank and of an inference engine, from the model's tensor shapes and the layouts.

Trainer (megatron-core, Adam): weights in the model dtype; gradients in fp32 buffers (``grad_reduce_in_fp32``);
Adam's two fp32 moments plus an fp32 master copy where the weights are not fp32, sharded over data-parallel
ranks by the distributed optimizer (expert tensors over the expert-data-parallel ranks); activations of one
micro-batch. The static parts are checked against megatron's own accounting (``parallel.memory``) on the
tiny models. Engine (vLLM): weights split over its TP ranks, and the KV cache that the rest of its memory
share holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from weight_transfer.layout import TrainerLayout, tp_split_dim
from weight_transfer.plan import TensorSpec, element_size

GiB = 1 << 30
ENGINE_OVERHEAD_BYTES = 2 * GiB
"""What a vLLM engine takes besides weights and KV cache (CUDA context, activations, graphs); a round figure."""


@dataclass(frozen=True)
class RankElements:
    """Parameter elements one trainer rank holds: dense (replicated over data parallel) and routed experts."""

    dense: int
    expert: int

    @property
    def total(self) -> int:
        return self.dense + self.expert


def rank_elements(specs: list[TensorSpec], layout: TrainerLayout) -> dict[int, RankElements]:
    """Elements held by each rank of the first replica group of every stage (``layout.replica_ranks`` ranks)."""
    dense: dict[int, int] = {}
    expert: dict[int, int] = {}
    for spec in specs:
        numel = spec.nbytes // element_size(spec.dtype)
        is_expert = layout.is_expert(spec.name)
        if tp_split_dim(spec.name) is not None:
            numel //= layout.expert_tp if is_expert else layout.tp
        target = expert if is_expert else dense
        for rank in layout.holders(spec.name):
            target[rank] = target.get(rank, 0) + numel
    ranks = set(dense) | set(expert)
    return {r: RankElements(dense.get(r, 0), expert.get(r, 0)) for r in sorted(ranks)}


def trainer_static_bytes(specs: list[TensorSpec], layout: TrainerLayout, dtype: str,
                         distributed_optimizer: bool = True) -> dict[str, int]:
    """Weights, gradients and optimizer state of the rank that holds the most (bytes)."""
    width = element_size(dtype)
    master = 0 if dtype == "float32" else 4
    dp, edp = layout.dp, layout.stage_ranks // (layout.expert_tp * layout.ep)
    best: dict[str, int] = {}
    for held in rank_elements(specs, layout).values():
        state = 8 + master
        optimizer = (held.dense * state // dp + held.expert * state // edp) if distributed_optimizer else held.total * state
        out = {"weights": held.total * width, "grads": held.total * 4, "optimizer": optimizer}
        if sum(out.values()) > sum(best.values()):
            best = out
    return best


def activation_bytes(config: dict, layout: TrainerLayout, dtype: str, tokens: int, recompute: str) -> int:
    """Activations one micro-batch of ``tokens`` keeps for the backward pass on the busiest pipeline stage.

    Per layer and token: the norms' inputs and outputs (4 x hidden, replicated over TP) and the TP-split
    projections' outputs (q, k, v, attention output; gate, up and activation of the MLP, top-k copies for
    MoE), in the model dtype; the logits in fp32 on the last stage. ``recompute=full`` keeps each layer's
    input only (plus one layer recomputed at a time). Pipeline 1F1B keeps up to ``pp`` micro-batches on the
    first stage."""
    from megatron_rl.runtime.shapes import num_experts

    width = element_size(dtype)
    hidden, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    moe = num_experts(config) > 0
    inter = config["moe_intermediate_size"] * config["num_experts_per_tok"] if moe else config["intermediate_size"]
    split = (2 * heads + 2 * kv) * head_dim + 3 * inter + (config["num_experts_per_tok"] * hidden if moe else 0)
    per_layer = tokens * width * (4 * hidden + split // layout.tp)
    layers = -(-config["num_hidden_layers"] // layout.pp)
    kept = tokens * width * hidden * layers + per_layer if recompute == "full" else per_layer * layers
    logits = tokens * (config["vocab_size"] // layout.tp) * 4
    return kept * layout.pp + logits


def engine_bytes(specs: list[TensorSpec], config: dict, tp: int, gpu_bytes: int, utilization: float,
                 dtype: str) -> dict[str, float]:
    """One engine GPU: weights (split over ``tp``), the KV cache its memory share leaves, tokens that cache holds."""
    weights = 0
    for spec in specs:
        weights += spec.nbytes // tp if tp_split_dim(spec.name) is not None else spec.nbytes
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_per_token = 2 * config["num_hidden_layers"] * max(1, kv // tp) * head_dim * element_size(dtype)
    cache = int(gpu_bytes * utilization) - weights - ENGINE_OVERHEAD_BYTES
    return {"weights": weights, "kv_cache": max(cache, 0), "kv_tokens": max(cache, 0) // kv_per_token,
            "overhead": ENGINE_OVERHEAD_BYTES, "fits": cache > 0}
