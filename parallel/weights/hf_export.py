"""This rank's megatron parameters -> (HF name, full tensor) pairs, streamed one parameter at a time.

Tensor-parallel shards are gathered within their TP group (every rank of the group must iterate);
pipeline stages and expert-parallel ranks each yield only their own layers and experts, so the
whole model is never assembled on one rank. A tensor is yielded only by its owner (TP rank 0 and
data-parallel rank 0 of its group), so across all ranks every HF tensor appears exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from parallel.weights.layout import split_gate_up, split_qkv
from parallel.weights.names import hf_source
from parallel.weights.placement import placements, unwrap


def hf_tensors_from_shards(source, shards: list[torch.Tensor], partition_dim, config) -> list[tuple[str, torch.Tensor]]:
    """Inverse of :func:`parallel.weights.hf_import.shard_from_hf` over all TP ranks' shards."""
    if source.kind == "gate_up":
        return list(zip(source.hf_names, split_gate_up(shards)))
    full = shards[0] if partition_dim is None else torch.cat(shards, dim=partition_dim)
    if source.kind == "qkv":
        q_rows = config.num_attention_heads * config.kv_channels
        kv_rows = config.num_query_groups * config.kv_channels
        return list(zip(source.hf_names, split_qkv(full, config.num_query_groups, q_rows, kv_rows)))
    return [(source.hf_names[0], full)]


def _gather(param: torch.Tensor, group) -> list[torch.Tensor]:
    if group.size() == 1:
        return [param.detach()]
    shards = [torch.empty_like(param) for _ in range(group.size())]
    dist.all_gather(shards, param.detach().contiguous(), group=group)
    return shards


@torch.no_grad()
def iter_hf_weights(model: torch.nn.Module, pg_collection) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for the tensors this rank owns; every rank must exhaust the iterator."""
    config = unwrap(model).config
    for _, (param, place) in placements(model, pg_collection).items():
        shards = _gather(param, place.tp_group) if place.partition_dim is not None else [param.detach()]
        if place.tp_group.rank() != 0 or place.owner_group.rank() != 0:
            continue
        yield from hf_tensors_from_shards(hf_source(place.global_name), shards, place.partition_dim, config)
