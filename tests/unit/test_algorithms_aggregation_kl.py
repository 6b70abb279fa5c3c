"""Hand-computed aggregations, KL estimators, KL penalty and entropy."""

import math

import pytest
import torch

from megatron_rl.algorithms.config import KLConfig
from megatron_rl.algorithms.entropy import token_entropy
from megatron_rl.algorithms.kl import kl_penalty_rewards, token_kl
from megatron_rl.algorithms.registry import KL_ESTIMATORS, LOSS_AGGREGATIONS

NAN = float("nan")
LOSS = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, 1e30, NAN, NAN], [NAN, NAN, NAN, NAN]])
LIVE = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 10 / 4),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", 10 / (4 * 3)),
    ],
)
def test_aggregations(mode, expected):
    assert LOSS_AGGREGATIONS.get(mode)(LOSS, LIVE, 4).item() == pytest.approx(expected)


def test_sum_norm_needs_a_length():
    with pytest.raises(ValueError, match="norm_length"):
        LOSS_AGGREGATIONS.get("seq-mean-token-sum-norm")(LOSS, LIVE, None)


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match="known: seq-mean-token-mean, seq-mean-token-sum"):
        LOSS_AGGREGATIONS.get("mean")


def test_kl_estimators_by_hand():
    lp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])  # log ratio = ln 2
    assert KL_ESTIMATORS.get("k1")(lp, ref).item() == pytest.approx(math.log(2))
    assert KL_ESTIMATORS.get("k2")(lp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert KL_ESTIMATORS.get("k3")(lp, ref).item() == pytest.approx(0.5 + math.log(2) - 1)
    assert KL_ESTIMATORS.get("k3")(torch.tensor([0.0]), torch.tensor([100.0])).item() == 10.0


def test_token_kl_masks_and_averages_live_tokens():
    lp = torch.tensor([[0.0, 0.0, NAN]])
    ref = torch.tensor([[-1.0, 0.0, 5.0]])
    kl, m = token_kl(lp, ref, torch.tensor([[1, 1, 0]]), "k1")
    assert kl.tolist() == [[1.0, 0.0, 0.0]]
    assert m["policy/kl"].item() == pytest.approx(0.5)


def test_kl_penalty_on_sequence_and_token_rewards():
    lp = torch.tensor([[0.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.0, -2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    config = KLConfig(use_kl_in_reward=True, kl_reward_coef=0.1, kl_estimator_type="k1")
    rewards, m = kl_penalty_rewards(torch.tensor([1.0]), lp, ref, mask, config)
    assert torch.allclose(rewards, torch.tensor([[-0.1, 1.0 - 0.2, 0.0]]))
    assert m["reward/kl_penalty"].item() == pytest.approx(0.15)
    rewards, _ = kl_penalty_rewards(torch.tensor([[0.5, 0.0, NAN]]), lp, ref, mask, config)
    assert torch.allclose(rewards, torch.tensor([[0.4, -0.2, 0.0]]))


def test_entropy_uniform_and_peaked():
    logits = torch.zeros(1, 3, 4)
    logits[0, 1] = torch.tensor([0.0, -1e4, -1e4, -1e4])
    logits[0, 2] = NAN
    entropy, m = token_entropy(logits, torch.tensor([[1, 1, 0]]))
    assert entropy[0].tolist() == pytest.approx([math.log(4), 0.0, 0.0], abs=1e-6)
    assert m["policy/entropy"].item() == pytest.approx(math.log(4) / 2)


def test_entropy_gradient_ignores_masked_garbage():
    logits = torch.randn(1, 2, 5)
    logits[0, 1] = NAN
    logits.requires_grad_(True)
    entropy, _ = token_entropy(logits, torch.tensor([[1, 0]]))
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 1].eq(0).all()


def test_entropy_shape_error():
    with pytest.raises(ValueError, match="logits"):
        token_entropy(torch.zeros(1, 3), torch.ones(1, 3))
