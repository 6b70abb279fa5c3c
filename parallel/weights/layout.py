"""Pure tensor layouts: fused QKV (grouped by KV head) and fused gate/up, per tensor-parallel shard."""

from __future__ import annotations

import torch


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_groups: int) -> torch.Tensor:
    """HF q/k/v (weights ``[rows, h]`` or biases ``[rows]``) -> megatron's ``linear_qkv`` layout.

    Megatron stores, per KV group, that group's query heads, then its key, then its value head;
    tensor parallelism then splits whole groups along dim 0.
    """
    tail = q.shape[1:]
    parts = [x.reshape(num_groups, -1, *tail) for x in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def split_qkv_blocks(fused: torch.Tensor, num_groups: int, q_rows: int, kv_rows: int):
    """(q, k, v) of a fused QKV as views ``[num_groups, rows / num_groups, ...]`` (no copy): each is one
    contiguous block of rows per KV group, and read in row-major order it is the HF tensor."""
    per_group = fused.reshape(num_groups, -1, *fused.shape[1:])
    qg, kg = q_rows // num_groups, kv_rows // num_groups
    return torch.split(per_group, [qg, kg, kg], dim=1)


def split_qkv(fused: torch.Tensor, num_groups: int, q_rows: int, kv_rows: int):
    """Inverse of :func:`fuse_qkv`: -> (q, k, v) with ``q_rows`` and ``kv_rows`` rows in total (copies,
    unless there is one group)."""
    return tuple(b.flatten(0, 1) for b in split_qkv_blocks(fused, num_groups, q_rows, kv_rows))


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s ``linear_fc1`` shard: its slice of gate rows, then its slice of up rows."""
    return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)


def split_gate_up(shards: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_gate_up` over all ranks' shards -> full (gate, up)."""
    halves = [s.chunk(2, dim=0) for s in shards]
    if len(halves) == 1:  # views, not copies: the consumer (a bucket pack, a save) copies anyway
        return halves[0]
    return torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])
