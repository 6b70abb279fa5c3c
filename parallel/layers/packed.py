"""Causal attention over packed sequences (several documents in one row, ``thd`` layout).

Every kernel takes ``q`` [t, hq, d], ``k``/``v`` [t, hkv, d] and ``cu_seqlens`` [n + 1] (int32,
starting at 0) and returns [t, hq, d]; a token attends to the earlier tokens of its own document
only. Tokens past ``cu_seqlens[-1]`` (trailing padding) form a document of their own. None of them
materialises the t×t score matrix:

- ``varlen``: torch's flash-attention varlen kernel (``torch.nn.attention.varlen``), CUDA only;
- ``flex``: FlexAttention with a document-causal block mask, compiled on CUDA (eager elsewhere,
  which is only fit for checking the mask);
- ``loop``: one ``scaled_dot_product_attention`` per document, any device.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch
import torch.nn.functional as F


PackedKernel = Callable[..., torch.Tensor]


def packed_loop(q, k, v, cu_seqlens, scale: float) -> torch.Tensor:
    """One causal SDPA call per document; exact reference and CPU path."""
    bounds = cu_seqlens.tolist()
    if bounds[-1] < q.shape[0]:
        bounds.append(q.shape[0])
    gqa = q.shape[1] != k.shape[1]
    pieces = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qi, ki, vi = (t[start:end].transpose(0, 1) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=gqa)
        pieces.append(out.transpose(0, 1))
    return torch.cat(pieces)


def packed_flex(q, k, v, cu_seqlens, scale: float, *, compiled: bool) -> torch.Tensor:
    """FlexAttention with a document-causal mask; ``compiled`` picks the fused kernel."""
    from torch.nn.attention.flex_attention import flex_attention

    attend = _compiled_flex() if compiled else flex_attention
    block_mask = _document_block_mask(cu_seqlens, q.shape[0])
    out = attend(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        block_mask=block_mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.squeeze(0).transpose(0, 1)


def packed_varlen(q, k, v, cu_seqlens, scale: float) -> torch.Tensor:
    """torch's flash varlen kernel; GQA heads are repeated where the installed torch lacks it."""
    from torch.nn.attention.varlen import varlen_attn

    total = q.shape[0]
    cu = cu_seqlens.to(torch.int32)
    if int(cu[-1]) < total:
        cu = torch.cat([cu, cu.new_tensor([total])])
    max_len = int((cu[1:] - cu[:-1]).max())
    params = _varlen_params()
    kwargs = {"scale": scale}
    kwargs.update({"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True})
    if "enable_gqa" in params:
        kwargs["enable_gqa"] = q.shape[1] != k.shape[1]
    elif q.shape[1] != k.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)


def select_packed_kernel(device: torch.device) -> tuple[str, PackedKernel]:
    """The fastest kernel this torch build offers on ``device``, and its name."""
    if device.type == "cuda":
        if _varlen_params():
            return "varlen", packed_varlen
        return "flex", functools.partial(packed_flex, compiled=True)
    return "loop", packed_loop


@functools.cache
def _varlen_params() -> frozenset[str]:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


_last_mask: tuple[torch.Tensor, int, object] | None = None


def _document_block_mask(cu_seqlens: torch.Tensor, total: int):
    """Block mask for one packing; reused by every layer of the same forward pass."""
    global _last_mask
    if _last_mask is not None and _last_mask[0] is cu_seqlens and _last_mask[1] == total:
        return _last_mask[2]
    from torch.nn.attention.flex_attention import create_block_mask

    positions = torch.arange(total, device=cu_seqlens.device)
    document = torch.searchsorted(cu_seqlens[1:].to(positions.dtype), positions, right=True)

    def document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (document[q_idx] == document[kv_idx])

    block_mask = create_block_mask(document_causal, None, None, total, total, device=cu_seqlens.device)
    _last_mask = (cu_seqlens, total, block_mask)
    return block_mask
