"""The math of the update: advantage estimators, policy losses, aggregation, KL, entropy, filters.

Pure tensor code (torch and ``correction`` only). Importing the package registers every built-in
estimator, loss, aggregation and KL estimator in :mod:`megatron_rl.algorithms.registry`.
"""

from megatron_rl.algorithms import advantages, aggregation, kl, policy_losses  # noqa: F401 (registers)
