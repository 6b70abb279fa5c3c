"""Policy losses, registered in :data:`megatron_rl.algorithms.registry.POLICY_LOSSES`.

Each returns ``(per-token loss [B, T], metrics)``, 0 at masked positions; aggregation is separate.
"""

from megatron_rl.algorithms.policy_losses import clipped, cov, gated, sequence, sft

__all__ = ["clipped", "cov", "gated", "sequence", "sft"]
