"""Algorithm settings (``algorithm.*``): advantage estimator, policy loss, aggregation, KL, filters.

Names follow SkyRL (and veRL for ``loss_agg_mode``) where the meaning is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from correction.config import CorrectionConfig
from correction.routing_replay import RoutingReplayConfig
from megatron_rl.algorithms import advantages, aggregation, kl, policy_losses  # noqa: F401 (registers)
from megatron_rl.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
)

_KEY = "algorithm"


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


def _require_name(key: str, value: str, registry) -> None:
    _require(value in registry, key, f"unknown {value!r}; known: {', '.join(registry.names())}")


@dataclass
class ClipCovConfig:
    """Clip-Cov (``algorithm.clip_cov``)."""

    clip_ratio: float = 0.0002
    """Fraction of live tokens whose gradient is dropped."""
    clip_cov_lb: float = 1.0
    """Only tokens with covariance above this are candidates."""
    clip_cov_ub: float = 5.0
    """Only tokens with covariance below this are candidates."""

    def __post_init__(self) -> None:
        key = f"{_KEY}.clip_cov"
        _require(0 <= self.clip_ratio <= 1, f"{key}.clip_ratio", f"must lie in [0, 1], got {self.clip_ratio}")
        _require(
            self.clip_cov_lb < self.clip_cov_ub,
            f"{key}.clip_cov_lb",
            f"must be < {key}.clip_cov_ub ({self.clip_cov_lb} >= {self.clip_cov_ub})",
        )


@dataclass
class KLCovConfig:
    """KL-Cov (``algorithm.kl_cov``)."""

    kl_cov_frac: float = 0.002
    """Fraction of live tokens (top covariance) that get the KL penalty."""
    ppo_kl_coef: float = 1.0
    """Coefficient of |log r| on those tokens."""

    def __post_init__(self) -> None:
        key = f"{_KEY}.kl_cov"
        _require(0 <= self.kl_cov_frac <= 1, f"{key}.kl_cov_frac", f"must lie in [0, 1], got {self.kl_cov_frac}")
        _require(self.ppo_kl_coef >= 0, f"{key}.ppo_kl_coef", f"must be >= 0, got {self.ppo_kl_coef}")


@dataclass
class SAPOConfig:
    """SAPO soft gate temperatures (``algorithm.sapo``)."""

    tau_pos: float = 1.0
    """Gate temperature for tokens with positive advantage."""
    tau_neg: float = 1.05
    """Gate temperature for tokens with non-positive advantage."""

    def __post_init__(self) -> None:
        for name in ("tau_pos", "tau_neg"):
            value = getattr(self, name)
            _require(value > 0, f"{_KEY}.sapo.{name}", f"must be > 0, got {value}")


@dataclass
class KLConfig:
    """KL to the reference policy (``algorithm.kl``); off by default."""

    use_kl_loss: bool = False
    """Add kl_loss_coef * KL (aggregated like the policy loss) to the loss."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss term."""
    use_kl_in_reward: bool = False
    """Subtract kl_reward_coef * KL from the token rewards before advantages."""
    kl_reward_coef: float = 0.001
    """Weight of the KL reward penalty."""
    kl_estimator_type: str = "k3"
    """k1, k2 or k3 (low variance)."""

    @property
    def needs_reference(self) -> bool:
        """Whether a reference policy must run (KL as a loss term or as a reward penalty)."""
        return self.use_kl_loss or self.use_kl_in_reward

    def __post_init__(self) -> None:
        key = f"{_KEY}.kl"
        _require_name(f"{key}.kl_estimator_type", self.kl_estimator_type, KL_ESTIMATORS)
        for name in ("kl_loss_coef", "kl_reward_coef"):
            value = getattr(self, name)
            _require(value >= 0, f"{key}.{name}", f"must be >= 0, got {value}")


@dataclass
class FilterConfig:
    """Trajectory and group filters (``algorithm.filters``); off by default."""

    zero_variance_filter: bool = False
    """Drop groups whose live trajectories all have (nearly) the same reward."""
    zero_variance_tol: float = 1e-6
    """A group's reward std at or below this counts as zero."""
    dynamic_sampling_type: str | None = None
    """DAPO dynamic sampling: None, "filter" (drop) or "replace" (fill from extra groups)."""
    dynamic_sampling_target_groups: int = 0
    """Groups per batch that "replace" fills up to."""
    dynamic_sampling_max_rounds: int = 10
    """"replace": generation rounds per step at most (DAPO's ``max_num_gen_batches``); the step trains on the
    groups it has after them."""
    overlong_filtering: bool = False
    """Mask truncated responses out of the loss."""
    overlong_buffer_len: int = 0
    """Soft overlong penalty ramp length in tokens; 0 disables the penalty."""
    overlong_penalty_factor: float = 1.0
    """Penalty at (and beyond) max_response_length."""
    max_response_length: int | None = None
    """Response length at which the soft penalty is full."""

    def __post_init__(self) -> None:
        key = f"{_KEY}.filters"
        _require(self.zero_variance_tol >= 0, f"{key}.zero_variance_tol", "must be >= 0")
        _require(
            self.dynamic_sampling_type in (None, "filter", "replace"),
            f"{key}.dynamic_sampling_type",
            f"unknown {self.dynamic_sampling_type!r}; known: None, filter, replace",
        )
        if self.dynamic_sampling_type == "replace":
            _require(
                self.dynamic_sampling_target_groups > 0,
                f"{key}.dynamic_sampling_target_groups",
                "must be > 0 with dynamic_sampling_type=replace",
            )
        _require(self.dynamic_sampling_max_rounds >= 1, f"{key}.dynamic_sampling_max_rounds", "must be >= 1")
        _require(self.overlong_buffer_len >= 0, f"{key}.overlong_buffer_len", "must be >= 0")
        if self.overlong_buffer_len:
            _require(
                self.max_response_length is not None
                and self.max_response_length >= self.overlong_buffer_len,
                f"{key}.max_response_length",
                f"must be set and >= overlong_buffer_len ({self.overlong_buffer_len})",
            )


@dataclass
class AlgorithmConfig:
    """The math of the update (``algorithm``)."""

    advantage_estimator: str = "grpo"
    """grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae, or a registered name."""
    grpo_norm_by_std: bool = True
    """GRPO: divide by the group std (+ advantage_epsilon)."""
    advantage_epsilon: float = 1e-6
    """Added to the group std before dividing."""
    gamma: float = 1.0
    """Discount (GAE, REINFORCE++)."""
    lambd: float = 1.0
    """GAE lambda."""
    policy_loss_type: str = "regular"
    """regular (PPO clip), dual_clip, gspo, cispo, sapo, clip_cov, kl_cov, rollout_is, cross_entropy."""
    eps_clip_low: float = 0.2
    """Ratio clip lower range: r >= 1 - eps_clip_low."""
    eps_clip_high: float = 0.2
    """Ratio clip upper range: r <= 1 + eps_clip_high (DAPO clip-higher: 0.28)."""
    clip_ratio_c: float = 3.0
    """Dual clip: the loss of a negative-advantage token is capped at -A * clip_ratio_c."""
    loss_agg_mode: str = "token-mean"
    """token-mean, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm."""
    loss_agg_norm_length: int | None = None
    """seq-mean-token-sum-norm: the fixed length each sequence's token sum is divided by."""
    entropy_coeff: float = 0.0
    """Entropy bonus weight (the loss subtracts entropy_coeff * entropy)."""
    ppo_mini_batch_size: int = 0
    """Groups per optimizer step (0: the whole batch in one step)."""
    ppo_epochs: int = 1
    """Passes over the batch; with several optimizer steps per batch the clip ratio sees real lag."""
    old_logprobs: str = "trainer"
    """The clip ratio's old policy when a batch takes several steps: trainer (a separate pass with the
    batch's starting weights) or rollout (the sampler's log-probs)."""
    clip_cov: ClipCovConfig = field(default_factory=ClipCovConfig)
    """Clip-Cov settings."""
    kl_cov: KLCovConfig = field(default_factory=KLCovConfig)
    """KL-Cov settings."""
    sapo: SAPOConfig = field(default_factory=SAPOConfig)
    """SAPO settings."""
    kl: KLConfig = field(default_factory=KLConfig)
    """KL to the reference policy."""
    filters: FilterConfig = field(default_factory=FilterConfig)
    """Group and overlong filters."""
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    """Off-policy correction (train vs rollout log-probs)."""
    routing_replay: RoutingReplayConfig = field(default_factory=RoutingReplayConfig)
    """MoE routing replay."""

    def __post_init__(self) -> None:
        _require_name(f"{_KEY}.advantage_estimator", self.advantage_estimator, ADVANTAGE_ESTIMATORS)
        _require_name(f"{_KEY}.policy_loss_type", self.policy_loss_type, POLICY_LOSSES)
        _require_name(f"{_KEY}.loss_agg_mode", self.loss_agg_mode, LOSS_AGGREGATIONS)
        for name in ("eps_clip_low", "eps_clip_high", "advantage_epsilon", "entropy_coeff"):
            value = getattr(self, name)
            _require(value >= 0, f"{_KEY}.{name}", f"must be >= 0, got {value}")
        _require(self.eps_clip_low < 1, f"{_KEY}.eps_clip_low", f"must be < 1, got {self.eps_clip_low}")
        _require(self.clip_ratio_c > 1, f"{_KEY}.clip_ratio_c", f"must be > 1, got {self.clip_ratio_c}")
        _require(self.ppo_mini_batch_size >= 0, f"{_KEY}.ppo_mini_batch_size", "must be >= 0 (0: the whole batch)")
        _require(self.ppo_epochs >= 1, f"{_KEY}.ppo_epochs", f"must be >= 1, got {self.ppo_epochs}")
        _require(self.old_logprobs in ("trainer", "rollout"), f"{_KEY}.old_logprobs",
                 f"unknown {self.old_logprobs!r}; known: trainer, rollout")
        for name in ("gamma", "lambd"):
            value = getattr(self, name)
            _require(0 <= value <= 1, f"{_KEY}.{name}", f"must lie in [0, 1], got {value}")
        if self.loss_agg_mode == "seq-mean-token-sum-norm":
            _require(
                self.loss_agg_norm_length is not None and self.loss_agg_norm_length > 0,
                f"{_KEY}.loss_agg_norm_length",
                "must be a positive length with loss_agg_mode=seq-mean-token-sum-norm",
            )
