"""Document-causal packed attention kernels against SDPA with the full mask written out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parallel.layers.packed import packed_flex, packed_loop, select_packed_kernel


def _reference(q, k, v, cu, scale):
    """Materialised [t, t] document-causal mask: fine for a test, what the kernels avoid."""
    total = q.shape[0]
    doc = torch.searchsorted(cu[1:].long(), torch.arange(total), right=True)
    allowed = (doc[:, None] == doc[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.transpose(0, 1)


def _qkv(total, heads, groups, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(total, h, dim, generator=gen) for h in (heads, groups, groups)]


@pytest.mark.parametrize("bounds,total", [([0, 10, 25, 37], 37), ([0, 10, 25, 37], 44), ([0, 1, 2, 30], 30)])
@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2), (4, 1)])
def test_loop_matches_full_mask(bounds, total, heads, groups):
    q, k, v = _qkv(total, heads, groups)
    cu = torch.tensor(bounds, dtype=torch.int32)
    torch.testing.assert_close(packed_loop(q, k, v, cu, 0.3), _reference(q, k, v, cu, 0.3))


def test_loop_gradients_match_full_mask():
    q, k, v = (t.requires_grad_() for t in _qkv(30, 4, 2))
    cu = torch.tensor([0, 12, 30], dtype=torch.int32)
    grad_out = torch.randn(30, 4, 16)
    want = torch.autograd.grad(_reference(q, k, v, cu, 0.25), (q, k, v), grad_out)
    have = torch.autograd.grad(packed_loop(q, k, v, cu, 0.25), (q, k, v), grad_out)
    for got, expected in zip(have, want):
        torch.testing.assert_close(got, expected)


def test_flex_document_mask_matches_full_mask():
    q, k, v = _qkv(44, 4, 2)
    cu = torch.tensor([0, 10, 25, 37], dtype=torch.int32)
    with torch.no_grad():  # FlexAttention has no CPU backward; the GPU test covers gradients
        torch.testing.assert_close(packed_flex(q, k, v, cu, 0.3, compiled=False), _reference(q, k, v, cu, 0.3))


def test_cpu_selects_the_loop():
    assert select_packed_kernel(torch.device("cpu"))[0] == "loop"
