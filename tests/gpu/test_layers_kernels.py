"""The fast spec's GPU kernels against their exact loop references on the same device (bf16)."""

from __future__ import annotations

import torch

from parallel.layers.grouped_gemm import grouped_linear, grouped_mm_usable
from parallel.layers.packed import packed_loop, select_packed_kernel


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_grouped_gemm_kernel_matches_loop_bf16():
    gen = torch.Generator(device="cuda").manual_seed(0)
    counts = [700, 0, 1300, 37, 2048, 5, 900, 1]
    x = torch.randn(sum(counts), 512, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
    weights = [torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True) for _ in counts]
    assert grouped_mm_usable(x, weights[0]), "torch._grouped_mm should run bf16 on this GPU"
    grad_out = torch.randn(sum(counts), 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = grouped_linear(x, weights, torch.tensor(counts, device="cuda"))
    have = torch.autograd.grad(out, [x, *weights], grad_out)
    ref = torch.cat([xe @ w.t() for xe, w in zip(x.split(counts), weights)])
    want = torch.autograd.grad(ref, [x, *weights], grad_out)
    assert _rel(out, ref) < 1e-2
    for got, expected in zip(have, want):
        assert expected.abs().sum() == 0 and got.abs().sum() == 0 or _rel(got, expected) < 1e-2


def test_packed_kernel_matches_per_document_sdpa_bf16():
    name, kernel = select_packed_kernel(torch.device("cuda"))
    assert name in ("varlen", "flex")
    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths = [1000, 37, 2900, 159]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (
        torch.randn(sum(lengths), h, 128, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        for h in (16, 4, 4)
    )
    grad_out = torch.randn_like(q)
    out = kernel(q, k, v, cu, 128**-0.5)
    have = torch.autograd.grad(out, (q, k, v), grad_out)
    ref = packed_loop(q, k, v, cu, 128**-0.5)
    want = torch.autograd.grad(ref, (q, k, v), grad_out)
    assert _rel(out, ref) < 1e-2, name
    for got, expected in zip(have, want):
        assert _rel(got, expected) < 2e-2, name
