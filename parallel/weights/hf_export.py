"""This rank's megatron parameters -> (HF name, full tensor) pairs, streamed one parameter at a time.

Tensor-parallel shards are gathered within their TP group (every rank of the group must iterate);
pipeline stages and expert-parallel ranks each yield only their own layers and experts, so the
whole model is never assembled on one rank. A tensor is yielded only by its owner (TP rank 0 and
data-parallel rank 0 of its group), so across all ranks every HF tensor appears exactly once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parallel.weights.layout import split_gate_up, split_qkv, split_qkv_blocks
from parallel.weights.names import HFSource, hf_source
from parallel.weights.placement import placements, unwrap


def hf_tensors_from_shards(source, shards: list[torch.Tensor], partition_dim, config,
                           row_blocks: bool = False) -> list[tuple[str, torch.Tensor]]:
    """Inverse of :func:`parallel.weights.hf_import.shard_from_hf` over all TP ranks' shards.

    One shard (TP=1) is never concatenated: ``torch.cat`` of one tensor is a full copy, and a transfer
    that packs the result copies it again anyway. With ``row_blocks`` q, k and v come as row-block views
    of the fused QKV (:func:`split_qkv_blocks`) instead of HF-shaped copies."""
    if source.kind == "gate_up":
        return list(zip(source.hf_names, split_gate_up(shards)))
    full = shards[0] if partition_dim is None or len(shards) == 1 else torch.cat(shards, dim=partition_dim)
    if source.kind == "qkv":
        q_rows = config.num_attention_heads * config.kv_channels
        kv_rows = config.num_query_groups * config.kv_channels
        split = split_qkv_blocks if row_blocks else split_qkv
        return list(zip(source.hf_names, split(full, config.num_query_groups, q_rows, kv_rows)))
    return [(source.hf_names[0], full)]


def _gather(param: torch.Tensor, group) -> list[torch.Tensor]:
    shards = [torch.empty_like(param) for _ in range(group.size())]
    dist.all_gather(shards, param.detach().contiguous(), group=group)
    return shards


@dataclass(frozen=True)
class _Entry:
    param: torch.nn.Parameter
    source: HFSource
    partition_dim: int | None
    gather_group: object | None
    """The TP group to gather over, or None when this rank holds the whole tensor."""
    owned: bool
    """Whether this rank yields the tensor (TP rank 0 and data-parallel rank 0 of its groups)."""


class HFExport:
    """A model's export, planned once: which parameters this rank gathers, owns and how each maps to HF
    tensors. Weight transfers export every update, so the per-update loop does only the tensor work
    (tens of microseconds of Python per parameter, otherwise, against a few of GPU copy)."""

    def __init__(self, model: torch.nn.Module, pg_collection):
        self.config = unwrap(model).config
        self._views: dict[bool, tuple[tuple, bool]] = {}  # row_blocks -> (layout key, all tensors are views)
        self.entries = []
        for param, place in placements(model, pg_collection).values():
            split = place.partition_dim is not None and place.tp_group.size() > 1
            owned = place.tp_group.rank() == 0 and place.owner_group.rank() == 0
            self.entries.append(_Entry(param, hf_source(place.global_name), place.partition_dim,
                                       place.tp_group if split else None, owned))
        self._params = [e.param for e in self.entries]
        self._gathers = any(e.gather_group is not None for e in self.entries)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.tensors()

    def tensors(self, row_blocks: bool = False) -> ExportedTensors:
        """(HF name, tensor) for the tensors this rank owns; every rank must exhaust the iterator. Works on
        detached parameters, so no autograd graph is recorded (no ``no_grad``: a generator re-enters it
        at every yield).

        ``row_blocks``: q, k and v of a fused QKV come as ``[groups, rows / groups, ...]`` views (their HF
        tensor read in row-major order) instead of HF-shaped copies, for consumers that only read the bytes
        (:func:`weight_transfer.sender.send_weights`): on the H200 the three copies per layer cost a 1B
        model's export 0.3 ms of GPU and 1 ms of host time."""
        return ExportedTensors(self._tensors(row_blocks), lambda: self.static_key(row_blocks),
                               lambda: self.addresses(row_blocks))

    def addresses(self, row_blocks: bool = False) -> tuple | None:
        """The parameters' addresses where :meth:`static_key` may not be None: its cheap part, a tenth of
        its cost (a 1B model: 0.012 against 0.11 ms on the H200's host)."""
        if self._gathers:
            return None
        return row_blocks, tuple(map(torch.Tensor.data_ptr, self._params))

    def static_key(self, row_blocks: bool = False) -> tuple | None:
        """The addresses, shapes, strides and dtypes of the parameters when every exported tensor is a view
        of one (no TP gather, no copy); equal keys mean the export yields the very same tensors. None
        otherwise. Checked by exporting once whenever the parameters' layout changes."""
        if self._gathers:
            return None
        key = (row_blocks, tuple((p.data_ptr(), p.shape, p.stride(), p.dtype) for p in self._params))
        known = self._views.get(row_blocks)
        if known is None or known[0] != key:
            views = all(t.untyped_storage().data_ptr() == e.param.untyped_storage().data_ptr()
                        for e in self.entries if e.owned
                        for _, t in hf_tensors_from_shards(e.source, [e.param.detach()], e.partition_dim, self.config,
                                                           row_blocks))
            known = self._views[row_blocks] = (key, views)
        return key if known[1] else None

    def _tensors(self, row_blocks: bool) -> Iterator[tuple[str, torch.Tensor]]:
        for e in self.entries:
            shards = _gather(e.param, e.gather_group) if e.gather_group is not None else [e.param.detach()]
            if e.owned:
                yield from hf_tensors_from_shards(e.source, shards, e.partition_dim, self.config, row_blocks)


class ExportedTensors:
    """An export's (HF name, tensor) iterator with its ``static_key`` (:meth:`HFExport.static_key`) and
    ``addresses`` (:meth:`HFExport.addresses`; None where not given): a weight transfer replays its last
    pack of the same key instead of reading the iterator, starting on equal addresses. Both are computed
    when first read, so consumers that only iterate (a checkpoint save) do not pay for them."""

    def __init__(self, tensors: Iterator[tuple[str, torch.Tensor]], static_key: Callable[[], tuple | None],
                 addresses: Callable[[], tuple | None] | None = None):
        self._tensors, self._static_key, self._addresses = tensors, static_key, addresses

    @functools.cached_property
    def static_key(self) -> tuple | None:
        return self._static_key()

    @functools.cached_property
    def addresses(self) -> tuple | None:
        return self._addresses() if self._addresses is not None else None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        return next(self._tensors)


def iter_hf_weights(model: torch.nn.Module, pg_collection) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for the tensors this rank owns; every rank must exhaust the iterator."""
    return iter(HFExport(model, pg_collection))
