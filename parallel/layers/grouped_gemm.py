"""One linear layer per expert, run as one grouped GEMM over tokens sorted by expert.

``grouped_linear(x, weights, tokens_per_expert)`` equals concatenating ``x_e @ w_e.T`` over the
experts' consecutive row blocks of ``x``. The weights stay separate parameters (the layout of
megatron-core's ``SequentialMLP``); they are stacked inside the autograd function, so the stacked
copy is never saved for backward: backward stacks again and returns one gradient per expert.
``torch._grouped_mm`` runs it when the build has it and the shapes meet its 16-byte stride rule;
otherwise the same function loops over experts with plain matmuls.
"""

from __future__ import annotations

import torch

_GROUPED_MM = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
_CUDA_GROUPED_DTYPES = (torch.bfloat16,)
_CPU_GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def grouped_mm_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the grouped kernel takes ``x`` [T, in] against per-expert weights [out, in]."""
    if _GROUPED_MM is None:
        return False
    if x.is_cuda and (x.dtype not in _CUDA_GROUPED_DTYPES or torch.cuda.get_device_capability(x.device)[0] < 9):
        return False
    if not x.is_cuda and x.dtype not in _CPU_GROUPED_DTYPES:
        return False
    # Every row stride of the operands (and of the gradients) must be a multiple of 16 bytes.
    return all(dim * x.element_size() % 16 == 0 for dim in weight.shape)


def grouped_linear(x: torch.Tensor, weights: list[torch.Tensor], tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """``x`` [T, in] sorted by expert, ``weights`` E tensors [out, in], ``tokens_per_expert`` [E]."""
    if len(weights) != tokens_per_expert.numel():
        raise ValueError(f"{len(weights)} expert weights but tokens_per_expert has {tokens_per_expert.numel()} entries")
    return _GroupedLinear.apply(x, tokens_per_expert, *weights)


class _GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tokens_per_expert, *weights):
        grouped = grouped_mm_usable(x, weights[0])
        if grouped:
            offsets = tokens_per_expert.to(device=x.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            split = None
            out = _GROUPED_MM(x, torch.stack(weights).transpose(1, 2), offs=offsets)
        else:
            offsets = None
            split = tokens_per_expert.tolist()
            out = torch.cat([xe @ w.t() for xe, w in zip(x.split(split), weights)])
        ctx.save_for_backward(x, offsets, *weights)
        ctx.split = split
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, offsets, *weights = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        if ctx.split is None:
            stacked = torch.stack(weights)
            grad_x = _GROUPED_MM(grad_out, stacked, offs=offsets)
            grad_w = _GROUPED_MM(grad_out.t(), x, offs=offsets).unbind(0)
        else:
            pairs = list(zip(grad_out.split(ctx.split), x.split(ctx.split)))
            grad_x = torch.cat([g @ w for (g, _), w in zip(pairs, weights)])
            grad_w = [g.t() @ xe for g, xe in pairs]
        return (grad_x, None, *grad_w)
