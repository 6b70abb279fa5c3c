"""Bytes this rank holds: parameters, gradient buffers, optimizer state, and the process or GPU footprint."""

from __future__ import annotations

import psutil
import torch


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _inner_optimizers(optimizer) -> list:
    """The torch optimizers inside megatron's (possibly chained) optimizer."""
    return [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]


def optimizer_bytes(optimizer, model_params: list[torch.Tensor]) -> int:
    """Optimizer state (Adam moments) plus master copies that are not the model's own storage."""
    model_storages = {_storage(p) for p in model_params}
    total = 0
    for opt in _inner_optimizers(optimizer):
        for group in opt.param_groups:
            for p in group["params"]:
                if _storage(p) not in model_storages:
                    total += _nbytes(p)
                total += sum(_nbytes(v) for v in opt.state.get(p, {}).values() if torch.is_tensor(v) and v.dim() > 0)
    return total


def grad_bytes(ddp_model) -> int:
    """DDP's contiguous gradient buffers (dense and expert)."""
    buffers = list(ddp_model.buffers) + list(ddp_model.expert_parallel_buffers)
    return sum(_nbytes(b.grad_data) for b in buffers if b.grad_data is not None)


def memory_report(ddp_model, optimizer) -> dict[str, int]:
    """This rank's bytes: ``params``, ``grads``, ``optimizer``, and ``rss`` (CPU) or ``cuda_*`` (GPU)."""
    params = list(ddp_model.module.parameters())
    out = {
        "params": sum(_nbytes(p) for p in params),
        "grads": grad_bytes(ddp_model),
        "optimizer": optimizer_bytes(optimizer, params),
        "rss": psutil.Process().memory_info().rss,
    }
    if torch.cuda.is_available():
        out["cuda_allocated"] = torch.cuda.memory_allocated()
        out["cuda_peak"] = torch.cuda.max_memory_allocated()
    return out
