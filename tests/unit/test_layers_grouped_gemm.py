"""grouped_linear equals the per-expert loop (outputs and every gradient), on both of its paths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel.layers.grouped_gemm import grouped_linear, grouped_mm_usable


def _loop(x, weights, counts):
    return torch.cat([xe @ w.t() for xe, w in zip(x.split(counts), weights)])


def _grads(fn, x, weights, counts, grad_out):
    x = x.detach().requires_grad_()
    weights = [w.detach().requires_grad_() for w in weights]
    out = fn(x, weights, counts)
    out.backward(grad_out)
    return out.detach(), x.grad, [w.grad for w in weights]


def _compare(counts, d_in, d_out, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(counts), d_in, generator=gen, dtype=dtype)
    weights = [torch.randn(d_out, d_in, generator=gen, dtype=dtype) for _ in counts]
    grad_out = torch.randn(sum(counts), d_out, generator=gen, dtype=dtype)
    want = _grads(_loop, x, weights, counts, grad_out)
    have = _grads(lambda a, w, c: grouped_linear(a, w, torch.tensor(c)), x, weights, counts, grad_out)
    torch.testing.assert_close(have[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(have[1], want[1], rtol=1e-5, atol=1e-5)
    for got, expected in zip(have[2], want[2]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=5), d_in=st.sampled_from([8, 16]), d_out=st.sampled_from([4, 24]))
def test_grouped_kernel_matches_loop(counts, d_in, d_out):
    assert grouped_mm_usable(torch.zeros(1, d_in), torch.zeros(d_out, d_in))
    _compare(counts, d_in, d_out)


@settings(max_examples=10, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=4))
def test_fallback_loop_matches_when_strides_are_unaligned(counts):
    assert not grouped_mm_usable(torch.zeros(1, 6), torch.zeros(10, 6))
    _compare(counts, 6, 10)


def test_float64_takes_the_fallback_and_matches():
    assert not grouped_mm_usable(torch.zeros(1, 8, dtype=torch.float64), torch.zeros(8, 8, dtype=torch.float64))
    _compare([3, 0, 4], 8, 8, dtype=torch.float64)


def test_expanded_gradient_is_accepted():
    x = torch.randn(5, 8, requires_grad=True)
    weights = [torch.randn(8, 8, requires_grad=True) for _ in range(2)]
    grouped_linear(x, weights, torch.tensor([2, 3])).sum().backward()  # grad_out has zero strides
    torch.testing.assert_close(weights[0].grad, x[:2].detach().sum(0).expand(8, 8))


def test_count_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match="tokens_per_expert"):
        grouped_linear(torch.randn(4, 8), [torch.randn(8, 8)] * 3, torch.tensor([2, 2]))
