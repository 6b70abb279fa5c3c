"""Config validation names the full dotted key; registries accept user functions by name."""

import pytest

from megatron_rl.algorithms.config import (
    AlgorithmConfig,
    ClipCovConfig,
    FilterConfig,
    KLConfig,
    KLCovConfig,
    SAPOConfig,
)
from megatron_rl.algorithms.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES


@pytest.mark.parametrize(
    "build, key",
    [
        (lambda: AlgorithmConfig(advantage_estimator="ppo"), "algorithm.advantage_estimator"),
        (lambda: AlgorithmConfig(policy_loss_type="ppo"), "algorithm.policy_loss_type"),
        (lambda: AlgorithmConfig(loss_agg_mode="mean"), "algorithm.loss_agg_mode"),
        (lambda: AlgorithmConfig(eps_clip_low=1.0), "algorithm.eps_clip_low"),
        (lambda: AlgorithmConfig(clip_ratio_c=1.0), "algorithm.clip_ratio_c"),
        (lambda: AlgorithmConfig(gamma=1.5), "algorithm.gamma"),
        (
            lambda: AlgorithmConfig(loss_agg_mode="seq-mean-token-sum-norm"),
            "algorithm.loss_agg_norm_length",
        ),
        (lambda: KLConfig(kl_estimator_type="k4"), "algorithm.kl.kl_estimator_type"),
        (lambda: KLConfig(kl_loss_coef=-1), "algorithm.kl.kl_loss_coef"),
        (lambda: ClipCovConfig(clip_cov_lb=5, clip_cov_ub=1), "algorithm.clip_cov.clip_cov_lb"),
        (lambda: KLCovConfig(kl_cov_frac=2), "algorithm.kl_cov.kl_cov_frac"),
        (lambda: SAPOConfig(tau_neg=0), "algorithm.sapo.tau_neg"),
        (lambda: FilterConfig(dynamic_sampling_type="drop"), "algorithm.filters.dynamic_sampling_type"),
        (
            lambda: FilterConfig(dynamic_sampling_type="replace"),
            "algorithm.filters.dynamic_sampling_target_groups",
        ),
        (lambda: FilterConfig(overlong_buffer_len=8), "algorithm.filters.max_response_length"),
    ],
)
def test_errors_name_the_key(build, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build()


def test_defaults_are_valid_and_corrections_off():
    config = AlgorithmConfig()
    assert not config.correction.enabled
    assert not config.kl.use_kl_loss


def test_user_registered_functions_are_accepted_by_name():
    @POLICY_LOSSES.register("test_user_loss")
    def user_loss(log_probs, old_log_probs, advantages, loss_mask, config, rollout_logprobs=None):
        return -log_probs, {}

    assert AlgorithmConfig(policy_loss_type="test_user_loss").policy_loss_type == "test_user_loss"
    with pytest.raises(ValueError, match="already registered"):
        POLICY_LOSSES.register("test_user_loss")(user_loss)


def test_builtin_names():
    assert ADVANTAGE_ESTIMATORS.names() == [
        "dr_grpo", "gae", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo",
    ]
