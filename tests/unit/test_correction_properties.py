"""Invariants of the correction stack on random shapes (hypothesis)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from correction.apply import apply_correction
from correction.config import CorrectionConfig
from correction.ratio import compute_log_ratio

ALL_ON = dict(
    outlier_token_is_threshold_low=0.2,
    outlier_token_is_threshold_high=5.0,
    token_mask_eps_low=0.3,
    token_mask_eps_high=0.3,
    sequence_mask_metric="geometric",
    geo_mask_low=0.8,
    geo_mask_high=1.25,
)


@st.composite
def batches(draw):
    b, t = draw(st.integers(1, 6)), draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) < draw(st.floats(0.0, 1.0))
    rollout = -torch.rand(b, t, generator=g) * 5
    old = rollout + torch.randn(b, t, generator=g) * draw(st.floats(0.0, 1.0))
    return old, rollout, mask


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["token", "sequence"]), st.sampled_from(["geometric", "product"]))
def test_masks_only_shrink_and_weights_are_capped(batch, tis, metric):
    old, rollout, mask = batch
    cfg = CorrectionConfig(**{**ALL_ON, "tis_ratio_type": tis, "sequence_mask_metric": metric})
    out, metrics = apply_correction(old, rollout, mask, cfg)
    assert not (out.loss_mask & ~mask).any()
    cap = cfg.token_tis_ratio_clip_high if tis == "token" else cfg.sequence_tis_ratio_clip_high
    assert ((out.weights > 0) & (out.weights <= cap)).all()
    assert all(torch.isfinite(v) for v in metrics.values())


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([float("nan"), float("inf"), -1e30]))
def test_masked_garbage_changes_nothing(batch, garbage):
    old, rollout, mask = batch
    cfg = CorrectionConfig(**ALL_ON, tis_ratio_type="token")
    clean, clean_m = apply_correction(old, rollout, mask, cfg)
    old2, rollout2 = old.clone(), rollout.clone()
    old2[~mask] = garbage
    rollout2[~mask] = -garbage
    dirty, dirty_m = apply_correction(old2, rollout2, mask, cfg)
    assert torch.equal(clean.loss_mask, dirty.loss_mask)
    assert torch.equal(clean.weights[mask], dirty.weights[mask])
    assert clean_m.keys() == dirty_m.keys()
    assert all(torch.equal(clean_m[k], dirty_m[k]) for k in clean_m)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["token", "sequence"]), st.sampled_from(["geometric", "product"]))
def test_ratio_one_is_the_identity(batch, tis, metric):
    _, rollout, mask = batch
    cfg = CorrectionConfig(
        tis_ratio_type=tis,
        sequence_mask_metric=metric,
        token_mask_eps_low=0.0,
        token_mask_eps_high=0.0,
        outlier_token_is_threshold_low=1.0,
        outlier_token_is_threshold_high=1.0,
        geo_mask_low=1.0,
        geo_mask_high=1.0,
        product_mask_low=1.0,
        product_mask_high=1.0,
    )
    out, _ = apply_correction(rollout.clone(), rollout, mask, cfg)
    assert torch.equal(out.loss_mask, mask)
    assert torch.equal(out.weights, torch.ones_like(out.weights))


@settings(max_examples=80, deadline=None)
@given(batches(), st.floats(-3.0, 3.0))
def test_ratio_metrics_match_a_direct_computation_over_live_tokens(batch, shift):
    old, rollout, mask = batch
    old = old + shift  # shifts push every live ratio above or below 1: the min/max fallbacks
    _, m = compute_log_ratio(old, rollout, mask)
    if not mask.any():
        assert all(v.item() == 0 for v in m.values())
        return
    diff = (old - rollout)[mask]
    ratio = diff.clamp(-20, 20).exp()
    expected = {
        "correction/is_ratio_mean": ratio.mean(),
        "correction/is_ratio_std": ratio.std(correction=0),
        "correction/is_ratio_min": ratio.min(),
        "correction/is_ratio_max": ratio.max(),
        "correction/logprob_abs_diff_mean": diff.abs().mean(),
        "correction/logprob_abs_diff_max": diff.abs().max(),
    }
    for key, value in expected.items():
        assert torch.allclose(m[key], value, rtol=1e-4, atol=1e-4), key
