"""Input checks and masked reductions shared by correction and the algorithms.

Tensors are ``[batch, response_len]`` with a ``loss_mask`` of the same shape (bool, or float 0/1).
Masked positions may hold anything, NaN and inf included: every reduction selects live values with
``torch.where`` first, so garbage never reaches a sum (``0 * nan`` would be ``nan``).
"""

from __future__ import annotations

import torch


def live_mask(loss_mask: torch.Tensor, where: str = "loss_mask") -> torch.Tensor:
    """Return ``loss_mask`` as a bool tensor; raise ``ValueError`` unless it is 2-D and 0/1."""
    if not isinstance(loss_mask, torch.Tensor) or loss_mask.dim() != 2:
        shape = tuple(loss_mask.shape) if isinstance(loss_mask, torch.Tensor) else type(loss_mask)
        raise ValueError(f"{where}: expected a [batch, response_len] tensor, got {shape}")
    if loss_mask.dtype == torch.bool:
        return loss_mask
    if not bool(((loss_mask == 0) | (loss_mask == 1)).all()):
        raise ValueError(f"{where}: values must be 0 or 1")
    return loss_mask != 0


def check_like(live: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless each tensor has ``live``'s shape and is finite where live."""
    check_shape(live, **tensors)
    for name, value in tensors.items():
        if not bool(torch.where(live, torch.isfinite(value), True).all()):
            raise ValueError(f"{name}: non-finite values at unmasked positions")


def check_shape(live: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless each tensor is floating with ``live``'s shape."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor) or value.shape != live.shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
            raise ValueError(f"{name}: expected shape {tuple(live.shape)} (like loss_mask), got {shape}")
        if not value.dtype.is_floating_point:
            raise ValueError(f"{name}: expected a floating tensor, got {value.dtype}")


def check_per_sequence(batch: int, **tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless each tensor is ``[batch]`` (and finite when floating)."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (batch,):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
            raise ValueError(f"{name}: expected shape ({batch},), got {shape}")
        if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name}: non-finite values")


def zero_dead(values: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """``values`` where live, exactly 0 elsewhere (whatever garbage was there)."""
    return torch.where(live, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, live: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of live values (over all, or along ``dim``)."""
    kept = zero_dead(values, live)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: torch.Tensor, live: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of live values; 0 where nothing is live."""
    count = live.sum() if dim is None else live.sum(dim)
    return masked_sum(values, live, dim) / count.clamp(min=1).to(values.dtype)


def masked_std(values: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Population standard deviation of all live values; 0 when fewer than two are live."""
    mean = masked_mean(values, live)
    var = masked_mean((values - mean).square(), live)
    return var.sqrt() if int(live.sum()) > 1 else torch.zeros_like(var)


def masked_whiten(values: torch.Tensor, live: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Shift live values to mean 0 and scale to std 1 (population std); dead positions become 0."""
    mean = masked_mean(values, live)
    std = masked_std(values, live)
    return zero_dead((values - mean) / (std + eps), live)


def masked_stats(prefix: str, values: torch.Tensor, live: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{prefix}_mean/_std/_min/_max`` of live values, as detached 0-d tensors (0 if none live)."""
    values = values.detach()
    if not bool(live.any()):
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        return {f"{prefix}_{k}": zero for k in ("mean", "std", "min", "max")}
    inf = torch.tensor(torch.inf, dtype=values.dtype, device=values.device)
    return {
        f"{prefix}_mean": masked_mean(values, live),
        f"{prefix}_std": masked_std(values, live),
        f"{prefix}_min": torch.where(live, values, inf).min(),
        f"{prefix}_max": torch.where(live, values, -inf).max(),
    }


def fraction(flags: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Fraction of live positions where ``flags`` holds, as a detached 0-d float tensor."""
    return ((flags & live).sum() / live.sum().clamp(min=1)).to(torch.float32)
