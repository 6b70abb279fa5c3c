"""Where a local megatron parameter sits in the whole model: global name and tensor-parallel split."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT_RE = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")


@dataclass(frozen=True)
class Placement:
    """One local parameter's global identity and shard."""

    global_name: str
    """Name with global layer and expert numbers, no wrapper prefix."""
    partition_dim: int | None
    """Dim split over tensor-parallel ranks, or None if every rank holds it whole."""
    tp_group: object
    """The tensor-parallel group of this parameter (expert TP for experts)."""
    owner_group: object
    """Data-parallel group of this parameter (expert DP for experts): its rank 0 owns exports."""


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


def placements(model: torch.nn.Module, pg_collection) -> dict[str, tuple[torch.nn.Parameter, Placement]]:
    """Local parameter name -> (parameter, placement), in ``named_parameters`` order."""
    gpt = unwrap(model)
    layer_numbers = [layer.layer_number - 1 for layer in gpt.decoder.layers]
    expert_offset = {}
    for i, layer in enumerate(gpt.decoder.layers):
        offsets = getattr(layer.mlp, "local_expert_indices", None)
        if offsets is not None:
            expert_offset[i] = offsets[0]
    out = {}
    for name, param in gpt.named_parameters():
        global_name = name
        m = _LAYER_RE.match(name)
        if m:
            local = int(m.group(1))
            global_name = f"decoder.layers.{layer_numbers[local]}." + name[m.end():]
            e = _EXPERT_RE.search(global_name)
            if e:
                expert = int(e.group(1)) + expert_offset[local]
                global_name = global_name[: e.start(1)] + str(expert) + global_name[e.end(1):]
        is_expert = not getattr(param, "allreduce", True)
        split = getattr(param, "tensor_model_parallel", False)
        out[name] = (
            param,
            Placement(
                global_name=global_name,
                partition_dim=param.partition_dim if split else None,
                tp_group=pg_collection.expt_tp if is_expert else pg_collection.tp,
                owner_group=pg_collection.expt_dp if is_expert else pg_collection.dp,
            ),
        )
    return out
