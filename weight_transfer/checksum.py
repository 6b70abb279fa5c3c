"""Checksums of flat buckets (fast, any device, same value on CPU and CUDA) and digests of single tensors."""

from __future__ import annotations

import hashlib

import torch

CHUNK_WORDS = 1 << 12


def bucket_checksum(flat: torch.Tensor) -> str:
    """Sum and chunk-position-weighted sum of the buffer's 64-bit words, wrapping modulo 2**64.

    Any single changed byte changes the plain sum; words moved between chunks change the weighted one.
    Summing int64 words reads at full memory bandwidth on a GPU (an int32 view summed into int64 ran at
    a fifth of it on the H200), and wrapping addition gives the same value in any order, on any device.
    ``flat`` is uint8 with a length that is a multiple of 8 (bucket sizes are 64-byte aligned).
    """
    return checksum_text(flat.numel(), checksum_words(flat).tolist())


def checksum_words(flat: torch.Tensor) -> torch.Tensor:
    """The two sums of :func:`bucket_checksum` as an int64 tensor on ``flat``'s device, without waiting
    for the device: a sender checksums each bucket as it is packed and reads them all once at the end."""
    words = flat.view(torch.int64)
    full = words.numel() // CHUNK_WORDS * CHUNK_WORDS
    chunk_sums = words[:full].view(-1, CHUNK_WORDS).sum(1)
    tail = words[full:].sum()
    weights = torch.arange(1, chunk_sums.numel() + 1, device=flat.device, dtype=torch.int64)
    plain = chunk_sums.sum() + tail
    weighted = (chunk_sums * weights).sum() + tail * (chunk_sums.numel() + 1)
    return torch.stack([plain, weighted])


def checksum_texts(words: dict) -> dict:
    """``{key: (nbytes, checksum words on the device)}`` -> ``{key: checksum}``, read back with one wait for
    the device instead of one per bucket."""
    values = torch.stack([w for _, w in words.values()]).tolist() if words else []
    return {key: checksum_text(nbytes, v) for (key, (nbytes, _)), v in zip(words.items(), values)}


def checksum_text(nbytes: int, words: list[int]) -> str:
    """The checksum of a bucket of ``nbytes`` from its two words (read back from the device)."""
    plain, weighted = words
    return f"{nbytes:x}-{plain & (2**64 - 1):016x}-{weighted & (2**64 - 1):016x}"


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (exact equality check; copies to host)."""
    data = tensor.detach().contiguous().cpu().view(torch.uint8).numpy()
    return hashlib.sha256(data.tobytes()).hexdigest()
