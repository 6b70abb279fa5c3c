"""Loss aggregation: per-token loss ``[B, T]`` and mask to one scalar (masked positions ignored).

Sequence means run over live sequences (at least one unmasked token), except the Dr.GRPO
``seq-mean-token-sum-norm``, whose denominators are constants: ``norm_length`` and the batch size.
"""

from __future__ import annotations

import torch

from correction.masked import zero_dead
from megatron_rl.algorithms.registry import LOSS_AGGREGATIONS


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(token_loss: torch.Tensor, live: torch.Tensor, norm_length: int | None = None) -> torch.Tensor:
    """Sum of live token losses / number of live tokens."""
    return zero_dead(token_loss, live).sum() / live.sum().clamp(min=1)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(
    token_loss: torch.Tensor, live: torch.Tensor, norm_length: int | None = None
) -> torch.Tensor:
    """Mean over live sequences of each sequence's token-loss sum."""
    return _mean_live_sequences(zero_dead(token_loss, live).sum(-1), live)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(
    token_loss: torch.Tensor, live: torch.Tensor, norm_length: int | None = None
) -> torch.Tensor:
    """Mean over live sequences of each sequence's token-loss mean."""
    per_seq = zero_dead(token_loss, live).sum(-1) / live.sum(-1).clamp(min=1)
    return _mean_live_sequences(per_seq, live)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    token_loss: torch.Tensor, live: torch.Tensor, norm_length: int | None = None
) -> torch.Tensor:
    """Dr.GRPO: sum of all live token losses / (``norm_length`` * batch size); no length bias."""
    if norm_length is None or norm_length <= 0:
        raise ValueError("seq-mean-token-sum-norm needs a positive norm_length (the max response length)")
    return zero_dead(token_loss, live).sum() / (norm_length * live.shape[0])


def _mean_live_sequences(per_seq: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    seq_live = live.any(-1)
    return zero_dead(per_seq, seq_live).sum() / seq_live.sum().clamp(min=1)
