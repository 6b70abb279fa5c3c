"""The fast bool-mask helpers agree with the plain torch ops they replace."""

import pytest
import torch

from correction.flags import above, as_float, below, count, narrow, rows_any


@pytest.fixture
def values():
    g = torch.Generator().manual_seed(0)
    return torch.randn(7, 5, generator=g).t()  # non-contiguous on purpose


@pytest.fixture
def flags(values):
    return values > 0.3


def test_comparisons_match_torch(values):
    values[0, 0] = 0.3
    assert torch.equal(above(values, 0.3), values > 0.3)
    assert torch.equal(below(values, 0.3), values < 0.3)
    assert above(values, 0.3).dtype == torch.bool


def test_as_float_is_zero_one(flags):
    out = as_float(flags, torch.float64)
    assert out.dtype == torch.float64
    assert torch.equal(out, flags.double())


def test_narrow_matches_and_with_broadcasting(flags):
    rows = torch.tensor([[True], [False], [True], [True], [False]])
    assert torch.equal(narrow(flags, rows), flags & rows)
    assert torch.equal(narrow(flags, ~flags), torch.zeros_like(flags))


def test_rows_any_and_count_match_torch(flags):
    flags[1] = False
    assert torch.equal(rows_any(flags), flags.any(-1, keepdim=True))
    assert count(flags).item() == flags.sum().item()
    assert torch.equal(count(flags, dim=-1), flags.sum(-1, keepdim=True).to(torch.int32))
    assert count(torch.zeros((), dtype=torch.bool).expand(3, 4)).item() == 0
