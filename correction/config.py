"""Off-policy correction settings (``algorithm.correction``); every correction is off by default.

Field names follow SkyRL's ``off_policy_correction`` block so its users can carry configs over.
"""

from __future__ import annotations

from dataclasses import dataclass

from correction.sequence_masks import SEQUENCE_MASK_METRICS
from correction.tis import TIS_RATIO_TYPES

_KEY = "algorithm.correction"


@dataclass
class CorrectionConfig:
    """Which corrections run, and their thresholds. Ratios are r = exp(train_old - rollout)."""

    tis_ratio_type: str | None = None
    """Truncated importance sampling: None (off), "token" or "sequence"."""
    token_tis_ratio_clip_high: float = 2.0
    """Token TIS cap C: each token's loss is weighted by min(r, C)."""
    sequence_tis_ratio_clip_high: float = 5.0
    """Sequence TIS cap C_seq: each sequence's loss is weighted by min(prod r, C_seq)."""
    sequence_mask_metric: str | None = None
    """Sequence mask: None (off), "geometric" (exp(mean log r)) or "product" (prod r)."""
    geo_mask_low: float = 0.99
    """Geometric mask: drop a sequence whose geometric-mean ratio is below this."""
    geo_mask_high: float = 1.01
    """Geometric mask: drop a sequence whose geometric-mean ratio is above this."""
    product_mask_low: float = 0.5
    """Product mask: drop a sequence whose ratio product is below this."""
    product_mask_high: float = 2.0
    """Product mask: drop a sequence whose ratio product is above this."""
    token_mask_eps_low: float | None = None
    """Token mask (IcePop): zero tokens with r < 1 - eps_low; None leaves the low side open."""
    token_mask_eps_high: float | None = None
    """Token mask (IcePop): zero tokens with r > 1 + eps_high; None leaves the high side open."""
    outlier_token_is_threshold_low: float | None = None
    """Outlier rejection: drop a sequence with any token r below this; None disables the bound."""
    outlier_token_is_threshold_high: float | None = None
    """Outlier rejection: drop a sequence with any token r above this; None disables the bound."""
    log_ratio_clamp: float = 20.0
    """Log ratios (token and sequence) are clamped to [-clamp, clamp] before exp."""

    def __post_init__(self) -> None:
        _check_name("tis_ratio_type", self.tis_ratio_type, TIS_RATIO_TYPES.names())
        _check_name("sequence_mask_metric", self.sequence_mask_metric, SEQUENCE_MASK_METRICS.names())
        for name in (
            "token_tis_ratio_clip_high",
            "sequence_tis_ratio_clip_high",
            "geo_mask_low",
            "geo_mask_high",
            "product_mask_low",
            "product_mask_high",
            "outlier_token_is_threshold_low",
            "outlier_token_is_threshold_high",
            "log_ratio_clamp",
        ):
            _check_positive(name, getattr(self, name))
        for name in ("token_mask_eps_low", "token_mask_eps_high"):
            _check_nonnegative(name, getattr(self, name))
        if self.token_mask_eps_low is not None and self.token_mask_eps_low >= 1:
            raise ValueError(f"{_KEY}.token_mask_eps_low must be < 1, got {self.token_mask_eps_low}")
        _check_order("geo_mask_low", "geo_mask_high", self.geo_mask_low, self.geo_mask_high)
        _check_order(
            "product_mask_low", "product_mask_high", self.product_mask_low, self.product_mask_high
        )
        _check_order(
            "outlier_token_is_threshold_low",
            "outlier_token_is_threshold_high",
            self.outlier_token_is_threshold_low,
            self.outlier_token_is_threshold_high,
        )

    @property
    def outlier_enabled(self) -> bool:
        return (
            self.outlier_token_is_threshold_low is not None
            or self.outlier_token_is_threshold_high is not None
        )

    @property
    def token_mask_enabled(self) -> bool:
        return self.token_mask_eps_low is not None or self.token_mask_eps_high is not None

    @property
    def enabled(self) -> bool:
        """Whether any correction runs at all."""
        return (
            self.tis_ratio_type is not None
            or self.sequence_mask_metric is not None
            or self.outlier_enabled
            or self.token_mask_enabled
        )


def _check_name(field: str, value: str | None, known: list[str]) -> None:
    if value is not None and value not in known:
        raise ValueError(f"{_KEY}.{field}: unknown {value!r}; known: None, {', '.join(known)}")


def _check_positive(field: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{_KEY}.{field} must be > 0, got {value}")


def _check_nonnegative(field: str, value: float | None) -> None:
    if value is not None and not value >= 0:
        raise ValueError(f"{_KEY}.{field} must be >= 0, got {value}")


def _check_order(low_field: str, high_field: str, low: float | None, high: float | None) -> None:
    if low is not None and high is not None and not low <= high:
        raise ValueError(f"{_KEY}.{low_field} ({low}) must be <= {_KEY}.{high_field} ({high})")
