"""Entropy of the policy's next-token distribution on unmasked tokens."""

from __future__ import annotations

import torch

from correction.masked import live_mask, masked_mean, zero_dead


def token_entropy(logits: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Entropy ``[B, T]`` of ``softmax(logits)`` (logits ``[B, T, V]``), 0 where masked.

    Masked rows are zeroed before the softmax, so garbage there reaches neither value nor gradient.
    """
    live = live_mask(loss_mask)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != live.shape:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits)
        raise ValueError(f"logits: expected shape {tuple(live.shape)} + (vocab,), got {shape}")
    logits = zero_dead(logits, live.unsqueeze(-1))
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("logits: non-finite values at unmasked positions")
    log_p = torch.log_softmax(logits.float(), dim=-1)
    entropy = zero_dead(-(log_p.exp() * log_p).sum(-1), live)
    return entropy, {"policy/entropy": masked_mean(entropy.detach(), live)}
