"""PPO's clipped value loss against hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from parallel.value_loss import clipped_value_loss

VALUES = [1.0, 0.0, 2.0]
OLD = [0.5, 0.5, 0.5]
RETURNS = [2.0, 1.0, 0.0]
MASK = [1.0, 1.0, 0.0]


def _run(clip):
    v = torch.tensor([VALUES], requires_grad=True)
    loss, metrics = clipped_value_loss(v, torch.tensor([OLD]), torch.tensor([RETURNS]), torch.tensor([MASK]), clip)
    loss.backward()
    return loss, metrics, v.grad[0]


def test_clipped_loss_takes_the_larger_error_per_token():
    # token 0: (1-2)^2 = 1 vs clipped v 0.5+0.2 = 0.7 -> (0.7-2)^2 = 1.69 (clipped larger)
    # token 1: (0-1)^2 = 1 vs clipped v 0.5-0.2 = 0.3 -> (0.3-1)^2 = 0.49 (unclipped larger)
    # token 2 is masked out. loss = 0.5 * (1.69 + 1) / 2
    loss, metrics, grad = _run(0.2)
    assert loss.item() == pytest.approx(0.6725)
    assert metrics["critic/clip_fraction"].item() == pytest.approx(0.5)
    assert metrics["critic/value_mean"].item() == pytest.approx(0.5)
    assert metrics["critic/abs_error"].item() == pytest.approx(1.0)
    # the clipped term is flat in v at token 0; token 1: d/dv 0.5 (v - R)^2 / 2 = (0 - 1) / 2
    assert grad.tolist() == pytest.approx([0.0, -0.5, 0.0])


def test_no_clip_is_half_mean_squared_error():
    loss, metrics, grad = _run(None)
    assert loss.item() == pytest.approx(0.5)
    assert metrics["critic/clip_fraction"].item() == 0.0
    assert grad.tolist() == pytest.approx([-0.5, -0.5, 0.0])


def test_within_clip_range_equals_unclipped():
    loss, _, _ = _run(10.0)
    assert loss.item() == pytest.approx(0.5)


def test_non_positive_clip_is_refused():
    with pytest.raises(ValueError, match="value_clip"):
        _run(0.0)
