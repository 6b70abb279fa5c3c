"""Hand-computed per-token policy losses and gradients, and the composed update loss."""

import math

import pytest
import torch

from correction.config import CorrectionConfig
from megatron_rl.algorithms.config import AlgorithmConfig, ClipCovConfig, KLConfig, KLCovConfig
from megatron_rl.algorithms.loss import policy_update_loss
from megatron_rl.algorithms.registry import POLICY_LOSSES


def _run(name, ratios, advantages, mask=None, old=None, rollout=None, **cfg):
    """Per-token loss and d(sum loss)/d(log_probs) for tokens with the given ratios r = pi/pi_old."""
    ratios = torch.tensor([ratios], dtype=torch.float64)
    old = torch.full_like(ratios, -1.0) if old is None else torch.tensor([old], dtype=torch.float64)
    log_probs = (old + ratios.log()).requires_grad_(True)
    mask = torch.ones_like(ratios) if mask is None else torch.tensor([mask], dtype=torch.float64)
    adv = torch.tensor([advantages], dtype=torch.float64)
    roll = None if rollout is None else torch.tensor([rollout], dtype=torch.float64)
    loss, metrics = POLICY_LOSSES.get(name)(log_probs, old, adv, mask, AlgorithmConfig(**cfg), roll)
    loss.sum().backward()
    return loss.detach()[0].tolist(), log_probs.grad[0].tolist(), metrics


def test_ppo_clip_pessimistic_min_with_separate_low_high():
    loss, grad, m = _run("regular", [1.5, 1.5, 0.5, 0.5], [1.0, -1.0, -1.0, 1.0], eps_clip_high=0.28)
    assert loss == pytest.approx([-1.28, 1.5, 0.8, -0.5])
    assert grad == pytest.approx([0.0, 1.5, 0.0, -0.5])  # clipped tokens get no gradient
    assert m["policy/ppo_clip_ratio"].item() == pytest.approx(0.5)


def test_dual_clip_caps_negative_advantage_loss():
    loss, grad, m = _run("dual_clip", [5.0, 5.0, 2.0], [-1.0, 1.0, -1.0], clip_ratio_c=3.0)
    assert loss == pytest.approx([3.0, -1.2, 2.0])
    assert grad == pytest.approx([0.0, 0.0, 2.0])
    assert m["policy/dual_clip_ratio"].item() == pytest.approx(1 / 3)


def test_rollout_is_uses_rollout_logprobs_as_behaviour():
    old = [-1.0, -1.0]
    rollout = [-1.0 - math.log(1.5), -1.0]  # pi / pi_rollout = 1.5 * r
    loss, _, _ = _run("rollout_is", [1.0, 1.0], [1.0, 1.0], old=old, rollout=rollout)
    assert loss == pytest.approx([-1.2, -1.0])
    with pytest.raises(ValueError, match="rollout_logprobs"):
        _run("rollout_is", [1.0], [1.0])


def test_gspo_uses_one_geometric_mean_ratio_per_sequence():
    loss, grad, _ = _run("gspo", [2.0, 1.0, 7.0], [1.0, 1.0, 1.0], mask=[1, 1, 0], eps_clip_high=0.5)
    s = math.sqrt(2.0)
    assert loss == pytest.approx([-s, -s, 0.0])
    assert grad == pytest.approx([-s, -s, 0.0])
    loss, grad, _ = _run("gspo", [2.0, 1.0], [1.0, 1.0], eps_clip_high=0.2)
    assert loss == pytest.approx([-1.2, -1.2])
    assert grad == pytest.approx([0.0, 0.0])


def test_cispo_clips_the_detached_weight_but_keeps_gradient():
    loss, grad, m = _run("cispo", [2.0, 1.0], [1.0, -1.0])
    lp = [-1.0 + math.log(2.0), -1.0]
    assert loss == pytest.approx([-1.2 * lp[0], 1.0 * lp[1]])
    assert grad == pytest.approx([-1.2, 1.0])
    assert m["policy/cispo_clip_ratio"].item() == pytest.approx(0.5)


def test_sapo_gate_value_and_unit_slope_at_ratio_one():
    loss, grad, _ = _run("sapo", [1.0, 1.0], [1.0, -1.0])
    assert loss == pytest.approx([-2.0 / 1.0, 2.0 / 1.05])
    assert grad == pytest.approx([-1.0, 1.0])
    r, tau = 2.0, 1.0
    sig = 1 / (1 + math.exp(-tau * (r - 1)))
    loss, grad, _ = _run("sapo", [r], [1.0])
    assert loss == pytest.approx([-sig * 4 / tau])
    assert grad == pytest.approx([-4 * sig * (1 - sig) * r])


def test_clip_cov_drops_gradient_of_high_covariance_token():
    # r = 1 everywhere; log-probs -0.5, -3, -2.5 (mean -2); A 2, 0, 1 (mean 1) -> cov 1.5, 1, 0
    old = [-0.5, -3.0, -2.5]
    loss, grad, m = _run(
        "clip_cov", [1.0, 1.0, 1.0], [2.0, 0.0, 1.0], old=old,
        clip_cov=ClipCovConfig(clip_ratio=0.0, clip_cov_lb=1.2, clip_cov_ub=5.0),
    )
    assert loss == pytest.approx([0.0, 0.0, -1.0])
    assert grad == pytest.approx([0.0, 0.0, -1.0])
    assert m["policy/clip_cov_ratio"].item() == pytest.approx(1 / 3)


def test_kl_cov_penalises_top_covariance_token():
    old = [-0.5 - 0.1, -3.0, -2.5]
    ratios = [math.exp(0.1), 1.0, 1.0]  # log-probs -0.5, -3, -2.5 as above
    loss, _, m = _run(
        "kl_cov", ratios, [2.0, 0.0, 1.0], old=old, kl_cov=KLCovConfig(kl_cov_frac=0.0, ppo_kl_coef=1.0)
    )
    assert loss == pytest.approx([-2 * math.exp(0.1) + 0.1, 0.0, -1.0])
    assert m["policy/kl_cov_ratio"].item() == pytest.approx(1 / 3)


def test_cross_entropy_is_negative_log_prob():
    loss, grad, m = _run("cross_entropy", [1.0, 1.0], [5.0, -5.0], old=[-1.0, -2.0])
    assert loss == pytest.approx([1.0, 2.0])
    assert grad == pytest.approx([-1.0, -1.0])
    assert m["policy/nll"].item() == pytest.approx(1.5)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_masked_garbage_changes_neither_loss_nor_gradient(name):
    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    old = torch.randn(2, 3) - 1
    rollout = old + 0.1 * torch.randn(2, 3)
    adv = torch.randn(2, 3)
    base = old + 0.1 * torch.randn(2, 3)
    results = []
    for garbage in (None, float("nan"), 1e30):
        lp, o, r, a = (t.clone() for t in (base, old, rollout, adv))
        if garbage is not None:
            for t in (lp, o, r, a):
                t[mask == 0] = garbage
        lp.requires_grad_(True)
        torch.manual_seed(1)
        loss, _ = POLICY_LOSSES.get(name)(lp, o, a, mask, AlgorithmConfig(), r)
        loss.sum().backward()
        results.append((loss.detach(), lp.grad))
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0])
        assert torch.equal(grad, results[0][1])
    assert results[0][0][mask == 0].eq(0).all()


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_bad_inputs_raise(name):
    x = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="advantages: expected shape"):
        POLICY_LOSSES.get(name)(x, x, torch.zeros(2, 4), mask, AlgorithmConfig(), x)
    bad = x.clone()
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="log_probs: non-finite"):
        POLICY_LOSSES.get(name)(bad, x, x, mask, AlgorithmConfig(), x)


def test_composed_loss_applies_tis_masks_kl_and_entropy():
    lp = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])
    rollout = old - torch.tensor([[math.log(3.0), 0.0], [math.log(9.0), 0.0]])  # r = 3, 1; 9, 1
    adv = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    ref = lp.detach() - math.log(2.0)
    config = AlgorithmConfig(
        correction=CorrectionConfig(
            tis_ratio_type="token", token_tis_ratio_clip_high=2.0, outlier_token_is_threshold_high=5.0
        ),
        kl=KLConfig(use_kl_loss=True, kl_loss_coef=0.5, kl_estimator_type="k1"),
        entropy_coeff=0.1,
    )
    entropy = torch.tensor([[1.0, 3.0], [100.0, 100.0]])
    loss, m = policy_update_loss(
        lp, old, adv, torch.ones(2, 2), config, rollout_logprobs=rollout, ref_log_probs=ref, entropy=entropy
    )
    # row 1 dropped by the outlier bound (r = 9); row 0: PPO loss -1 per token, TIS weights 2 and 1
    pg = (-1 * 2 + -1 * 1) / 2
    assert m["policy/pg_loss"].item() == pytest.approx(pg)
    assert loss.item() == pytest.approx(pg + 0.5 * math.log(2.0) - 0.1 * 2.0)
    assert m["correction/outlier_seq_masked_ratio"].item() == 0.5
    loss.backward()
    assert lp.grad[1].eq(0).all()


def test_composed_loss_needs_rollout_logprobs_when_correcting():
    config = AlgorithmConfig(correction=CorrectionConfig(tis_ratio_type="token"))
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        policy_update_loss(x, x, x, torch.ones(1, 2), config)
