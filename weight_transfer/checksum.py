"""Checksums of flat buckets (fast, any device, same value on CPU and CUDA) and digests of single tensors."""

from __future__ import annotations

import hashlib

import torch

_CHUNK_WORDS = 1 << 12


def bucket_checksum(flat: torch.Tensor) -> str:
    """Sum and chunk-position-weighted sum of the buffer's int32 words, with int64 accumulation.

    Any single changed byte changes the plain sum; words moved between chunks change the weighted one.
    ``flat`` is uint8 with a length that is a multiple of 4 (bucket sizes are 64-byte aligned).
    """
    words = flat.view(torch.int32)
    full = words.numel() // _CHUNK_WORDS * _CHUNK_WORDS
    chunk_sums = words[:full].view(-1, _CHUNK_WORDS).sum(1, dtype=torch.int64)
    tail = words[full:].sum(dtype=torch.int64)
    weights = torch.arange(1, chunk_sums.numel() + 1, device=flat.device, dtype=torch.int64)
    plain = chunk_sums.sum() + tail
    weighted = (chunk_sums * weights).sum() + tail * (chunk_sums.numel() + 1)
    return f"{flat.numel():x}-{plain.item() & (2**64 - 1):016x}-{weighted.item() & (2**64 - 1):016x}"


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (exact equality check; copies to host)."""
    data = tensor.detach().contiguous().cpu().view(torch.uint8).numpy()
    return hashlib.sha256(data.tobytes()).hexdigest()
