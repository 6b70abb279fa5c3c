"""The algorithm registries: a recipe picks each piece by name, a user registers their own.

    from megatron_rl.algorithms.registry import POLICY_LOSSES

    @POLICY_LOSSES.register("my_loss")
    def my_loss(log_probs, old_log_probs, advantages, loss_mask, config, rollout_logprobs=None):
        ...  # return (per-token loss, metrics)

Register before building the :class:`~megatron_rl.algorithms.config.AlgorithmConfig` that names it.
"""

from correction.registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage_estimator")
"""``fn(rewards, loss_mask, group_ids, config, values=None) -> (advantages [B, T], metrics)``."""

POLICY_LOSSES: Registry = Registry("policy_loss_type")
"""``fn(log_probs, old_log_probs, advantages, loss_mask, config, rollout_logprobs=None)
-> (per-token loss [B, T], metrics)``."""

LOSS_AGGREGATIONS: Registry = Registry("loss_agg_mode")
"""``fn(token_loss, loss_mask, norm_length) -> scalar``."""

KL_ESTIMATORS: Registry = Registry("kl_estimator_type")
"""``fn(log_probs, ref_log_probs) -> per-token KL estimate`` (elementwise, no masking)."""
