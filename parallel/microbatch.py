"""Dynamic batching: rows -> data-parallel shards -> micro-batches bounded by a padded-token budget.

Pure functions of row lengths, so every rank computes the same plan without communicating.
Every data-parallel rank gets the same number of micro-batches (MoE all-to-all and pipeline
schedules need every rank of a group to run the same number of forwards); a rank short of
micro-batches gets empty ones (``[]``), which the caller runs as one masked-out token.
"""

from __future__ import annotations


def shard_rows(lengths: list[int], num_shards: int) -> list[list[int]]:
    """Rows split over data-parallel ranks, longest first to the lightest shard (balanced tokens)."""
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    load = [0] * num_shards
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        target = min(range(num_shards), key=lambda s: (load[s], s))
        shards[target].append(row)
        load[target] += lengths[row]
    return [sorted(s) for s in shards]


def pack_rows(rows: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Rows grouped so each group's rows x longest row stays within ``max_tokens``.

    Rows go longest first, so a group's padding is small; a row longer than the budget gets a
    group of its own. Within a group rows keep batch order.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    for row in sorted(rows, key=lambda r: (-lengths[r], r)):
        width = lengths[current[0]] if current else lengths[row]
        if current and (len(current) + 1) * width > max_tokens:
            groups.append(sorted(current))
            current = []
        current.append(row)
    if current:
        groups.append(sorted(current))
    return groups


def plan(lengths: list[int], max_tokens: int, num_shards: int) -> list[list[list[int]]]:
    """Per data-parallel rank, its micro-batches (lists of row indices), equal in number across ranks."""
    if max_tokens <= 0:
        raise ValueError(f"trainer.max_tokens_per_micro_batch: must be > 0, got {max_tokens}")
    per_shard = [pack_rows(rows, lengths, max_tokens) for rows in shard_rows(lengths, num_shards)]
    count = max(1, max(len(p) for p in per_shard))
    return [p + [[] for _ in range(count - len(p))] for p in per_shard]
