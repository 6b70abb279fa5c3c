"""Hand-computed expectations for every correction and the composed entry point."""

import math

import pytest
import torch

from correction.apply import apply_correction
from correction.config import CorrectionConfig
from correction.ratio import compute_log_ratio
from correction.sequence_masks import geometric_sequence_mask, product_sequence_mask
from correction.tis import sequence_tis, token_tis
from correction.token_masks import outlier_mask, token_mask

LN2 = math.log(2.0)
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
# Ratios r: row 0: 2, 1/2, 1 | row 1: 4, 1 | row 2: 1.1 everywhere. Last entries are masked.
LOG_R = torch.tensor(
    [
        [LN2, -LN2, 0.0, float("nan")],
        [2 * LN2, 0.0, float("inf"), -1e9],
        [math.log(1.1)] * 4,
    ]
)


def _cfg(**kw):
    return CorrectionConfig(**kw)


def test_log_ratio_is_old_minus_rollout_clamped_and_zero_where_masked():
    old = torch.tensor([[-1.0, -2.0, -50.0, float("nan")]])
    rollout = torch.tensor([[-2.0, -1.0, -1.0, 3.0]])
    log_r, m = compute_log_ratio(old, rollout, torch.tensor([[1, 1, 1, 0]]), clamp=20.0)
    assert torch.allclose(log_r, torch.tensor([[1.0, -1.0, -20.0, 0.0]]))
    assert m["correction/is_ratio_max"].item() == pytest.approx(math.e)
    assert m["correction/is_ratio_min"].item() == pytest.approx(math.exp(-20))
    assert m["correction/is_ratio_mean"].item() == pytest.approx((math.e + 1 / math.e + math.exp(-20)) / 3)
    assert m["correction/logprob_abs_diff_mean"].item() == pytest.approx((1 + 1 + 49) / 3)
    assert m["correction/logprob_abs_diff_max"].item() == pytest.approx(49)


def test_token_tis_caps_and_detaches():
    log_r = LOG_R.clone().requires_grad_(False)
    w, m = token_tis(log_r, MASK, _cfg(token_tis_ratio_clip_high=3.0))
    expected = torch.tensor([[2.0, 0.5, 1.0, 1.0], [3.0, 1.0, 1.0, 1.0], [1.1] * 4])
    assert torch.allclose(w, expected)
    assert not w.requires_grad
    assert m["correction/tis_token_clip_high_ratio"].item() == pytest.approx(1 / 9)


def test_sequence_tis_is_capped_product_over_live_tokens():
    w, m = sequence_tis(LOG_R, MASK, _cfg(sequence_tis_ratio_clip_high=3.0))
    # products: 2 * 0.5 * 1 = 1; 4 * 1 = 4 -> 3; 1.1^4 = 1.4641
    assert torch.allclose(w, torch.tensor([[1.0], [3.0], [1.1**4]]))
    assert m["correction/tis_seq_clip_high_ratio"].item() == pytest.approx(1 / 3)
    assert m["correction/tis_seq_ratio_max"].item() == pytest.approx(4.0)


def test_geometric_mask_uses_mean_log_ratio():
    # geometric means: row 0: (2 * 0.5 * 1)^(1/3) = 1; row 1: sqrt(4) = 2; row 2: 1.1
    keep, m = geometric_sequence_mask(LOG_R, MASK, _cfg(geo_mask_low=0.95, geo_mask_high=1.5))
    assert keep.tolist() == [[True], [False], [True]]
    assert m["correction/geo_sequence_mask_masked_ratio"].item() == pytest.approx(1 / 3)
    assert m["correction/geo_sequence_mask_over_high_ratio"].item() == pytest.approx(1 / 3)
    assert m["correction/geo_sequence_mask_under_low_ratio"].item() == 0.0
    assert m["correction/geo_sequence_mask_ratio_mean"].item() == pytest.approx((1 + 2 + 1.1) / 3)
    keep, m = geometric_sequence_mask(LOG_R, MASK, _cfg(geo_mask_low=1.05, geo_mask_high=3.0))
    assert keep.tolist() == [[False], [True], [True]]
    assert m["correction/geo_sequence_mask_under_low_ratio"].item() == pytest.approx(1 / 3)


def test_product_mask_uses_product():
    keep, m = product_sequence_mask(LOG_R, MASK, _cfg(product_mask_low=0.9, product_mask_high=1.2))
    assert keep.tolist() == [[True], [False], [False]]  # products 1, 4, 1.4641
    assert m["correction/product_sequence_mask_over_high_ratio"].item() == pytest.approx(2 / 3)


def test_product_mask_never_overflows_on_long_sequences():
    log_r = torch.full((1, 5000), 1.0)
    keep, m = product_sequence_mask(log_r, torch.ones(1, 5000), _cfg())
    assert keep.tolist() == [[False]]
    assert torch.isfinite(m["correction/product_sequence_mask_ratio_max"])


def test_token_mask_zeroes_only_divergent_tokens():
    keep, m = token_mask(LOG_R, MASK, _cfg(token_mask_eps_low=0.4, token_mask_eps_high=0.5))
    # bounds [0.6, 1.5]: 2 out (high), 0.5 out (low), 4 out (high); masked positions are kept
    assert keep.tolist() == [
        [False, False, True, True],
        [False, True, True, True],
        [True, True, True, True],
    ]
    assert m["correction/token_mask_ratio"].item() == pytest.approx(3 / 9)
    assert m["correction/token_mask_over_high_ratio"].item() == pytest.approx(2 / 9)
    assert m["correction/token_mask_under_low_ratio"].item() == pytest.approx(1 / 9)


def test_token_mask_one_sided():
    keep, _ = token_mask(LOG_R, MASK, _cfg(token_mask_eps_high=1.5))
    assert keep.tolist()[:2] == [[True, True, True, True], [False, True, True, True]]


def test_outlier_mask_drops_whole_sequences():
    keep, m = outlier_mask(
        LOG_R, MASK, _cfg(outlier_token_is_threshold_low=0.4, outlier_token_is_threshold_high=3.0)
    )
    assert keep.tolist() == [[True], [False], [True]]
    assert m["correction/outlier_seq_masked_ratio"].item() == pytest.approx(1 / 3)
    assert m["correction/outlier_seq_over_high_ratio"].item() == pytest.approx(1 / 3)
    keep, m = outlier_mask(LOG_R, MASK, _cfg(outlier_token_is_threshold_low=0.6))
    assert keep.tolist() == [[False], [True], [True]]
    assert m["correction/outlier_seq_under_low_ratio"].item() == pytest.approx(1 / 3)


def test_outlier_bounds_excluding_one_ignore_masked_positions():
    # Masked positions reach the mask as r = 1, which both pairs of bounds reject; the last row has
    # no live token at all (kept, and not counted).
    r = torch.tensor([[1.2, 1.5, 9.0], [0.6, 0.9, 9.0], [1.1, 0.97, 9.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0]])
    keep, m = outlier_mask(
        r.log(), mask, _cfg(outlier_token_is_threshold_low=1.05, outlier_token_is_threshold_high=2.0)
    )
    assert keep.tolist() == [[True], [False], [False], [True]]
    assert m["correction/outlier_seq_under_low_ratio"].item() == pytest.approx(2 / 3)
    assert m["correction/outlier_seq_over_high_ratio"].item() == 0.0
    keep, m = outlier_mask(
        r.log(), mask, _cfg(outlier_token_is_threshold_low=0.5, outlier_token_is_threshold_high=0.95)
    )
    assert keep.tolist() == [[False], [True], [False], [True]]
    assert m["correction/outlier_seq_over_high_ratio"].item() == pytest.approx(2 / 3)


def _logprobs(log_r):
    """Rollout and train-old log-probs whose difference is ``log_r`` (garbage where masked)."""
    rollout = torch.full_like(log_r, -1.5)
    return rollout + log_r, rollout


def test_composed_order_outlier_token_mask_tis_sequence_mask():
    old, rollout = _logprobs(LOG_R)
    cfg = _cfg(
        outlier_token_is_threshold_low=0.45,  # drops nothing (min r is 0.5)
        outlier_token_is_threshold_high=3.0,  # drops row 1 (r = 4)
        token_mask_eps_low=0.4,  # drops r = 0.5 in row 0
        token_mask_eps_high=1.5,  # keeps r = 2
        tis_ratio_type="sequence",  # row 0 after masks: 2 * 1 = 2
        sequence_tis_ratio_clip_high=1.5,
        sequence_mask_metric="geometric",  # row 0: sqrt(2) > 1.2 -> dropped; row 2: 1.1 kept
        geo_mask_low=0.9,
        geo_mask_high=1.2,
    )
    out, m = apply_correction(old, rollout, MASK, cfg)
    assert out.loss_mask.tolist() == [[False] * 4, [False] * 4, [True] * 4]
    assert torch.allclose(out.weights, torch.tensor([[1.5], [1.0], [1.1**4]]))
    assert m["correction/token_mask_ratio"].item() == pytest.approx(1 / 7)  # of the 7 tokens left
    assert m["correction/loss_mask_kept_ratio"].item() == pytest.approx(4 / 9)


def test_off_by_default_is_identity_without_metrics():
    old, rollout = _logprobs(LOG_R)
    out, m = apply_correction(old, rollout, MASK, CorrectionConfig())
    assert m == {}
    assert torch.equal(out.loss_mask, MASK.bool())
    assert torch.equal(out.weights, torch.ones(3, 1))


def test_ratio_one_everywhere_makes_every_correction_the_identity():
    rollout = torch.randn(3, 4)
    for cfg in (
        _cfg(tis_ratio_type="token"),
        _cfg(tis_ratio_type="sequence"),
        _cfg(sequence_mask_metric="geometric"),
        _cfg(sequence_mask_metric="product"),
        _cfg(token_mask_eps_low=0.0, token_mask_eps_high=0.0),
        _cfg(outlier_token_is_threshold_low=1.0, outlier_token_is_threshold_high=1.0),
    ):
        out, m = apply_correction(rollout.clone(), rollout, MASK, cfg)
        assert torch.equal(out.loss_mask, MASK.bool()), cfg
        assert torch.equal(out.weights, torch.ones_like(out.weights)), cfg
        assert m["correction/is_ratio_mean"].item() == 1.0


@pytest.mark.parametrize(
    "fn", [token_tis, sequence_tis, geometric_sequence_mask, product_sequence_mask, token_mask, outlier_mask]
)
def test_bad_inputs_raise(fn):
    cfg = _cfg(token_mask_eps_low=0.1, outlier_token_is_threshold_high=2.0)
    with pytest.raises(ValueError, match="shape"):
        fn(LOG_R[:, :3], MASK, cfg)
    with pytest.raises(ValueError, match="non-finite"):
        fn(torch.full_like(LOG_R, float("nan")), MASK, cfg)
    with pytest.raises(ValueError, match="0 or 1"):
        fn(LOG_R, MASK * 2, cfg)


def test_composed_rejects_nonfinite_live_logprobs():
    old, rollout = _logprobs(LOG_R)
    old[0, 0] = float("inf")
    with pytest.raises(ValueError, match="train_old_logprobs: non-finite"):
        apply_correction(old, rollout, MASK, _cfg(tis_ratio_type="token"))


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"tis_ratio_type": "tokens"}, "algorithm.correction.tis_ratio_type"),
        ({"sequence_mask_metric": "mean"}, "algorithm.correction.sequence_mask_metric"),
        ({"geo_mask_low": 1.2, "geo_mask_high": 1.1}, "algorithm.correction.geo_mask_low"),
        ({"token_tis_ratio_clip_high": 0.0}, "algorithm.correction.token_tis_ratio_clip_high"),
        ({"token_mask_eps_low": 1.0}, "algorithm.correction.token_mask_eps_low"),
        ({"token_mask_eps_high": -0.1}, "algorithm.correction.token_mask_eps_high"),
        (
            {"outlier_token_is_threshold_low": 3.0, "outlier_token_is_threshold_high": 2.0},
            "algorithm.correction.outlier_token_is_threshold_low",
        ),
    ],
)
def test_config_errors_name_the_dotted_key(kw, key):
    with pytest.raises(ValueError, match=key):
        CorrectionConfig(**kw)
