"""HF safetensors -> this rank's megatron parameters (its stage, TP shard and local experts)."""

from __future__ import annotations

from pathlib import Path

import torch

from parallel.weights.hf_files import HFCheckpoint
from parallel.weights.layout import fuse_gate_up, fuse_qkv
from parallel.weights.names import hf_source
from parallel.weights.placement import placements


def shard_from_hf(source, get, partition_dim, rank: int, size: int, num_groups: int) -> torch.Tensor:
    """The local shard of one megatron parameter, built from its HF tensors."""
    hf = [get(n) for n in source.hf_names]
    if source.kind == "gate_up":
        return fuse_gate_up(hf[0], hf[1], rank, size)
    full = fuse_qkv(*hf, num_groups=num_groups) if source.kind == "qkv" else hf[0]
    return full if partition_dim is None else full.chunk(size, dim=partition_dim)[rank]


@torch.no_grad()
def load_hf_weights(model: torch.nn.Module, hf_dir: str | Path, pg_collection) -> None:
    """Copy every local parameter from the HF checkpoint; ValueError on a shape mismatch."""
    ckpt = HFCheckpoint(hf_dir)
    from parallel.weights.placement import unwrap

    num_groups = unwrap(model).config.num_query_groups
    for name, (param, place) in placements(model, pg_collection).items():
        group = place.tp_group
        shard = shard_from_hf(
            hf_source(place.global_name), ckpt.get, place.partition_dim, group.rank(), group.size(), num_groups
        )
        if shard.shape != param.shape:
            raise ValueError(
                f"{hf_dir}: {place.global_name} ({name}) expects shape {tuple(param.shape)}, "
                f"the checkpoint gives {tuple(shard.shape)}"
            )
        param.copy_(shard.to(param.dtype))
