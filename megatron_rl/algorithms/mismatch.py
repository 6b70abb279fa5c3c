"""How far the trainer's log-probs of the sampled tokens are from the sampler's: the train-inference
mismatch that TIS, masking and routing replay correct for, reported every train step."""

from __future__ import annotations

import math

import torch

from megatron_rl.algorithms.kl import k3


def rollout_mismatch(logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Trainer vs sampler log-probs of the sampled tokens, over the live (``mask``) tokens: the mean
    |difference|, KL(trainer || sampler) by k3 (what the R3 and TIS papers report) and the share of tokens
    whose probability differs by more than 2x either way (|difference| > ln 2)."""
    live = mask.sum().clamp(min=1)
    gap = (logp - rollout_logp).abs()
    return {
        "policy/rollout_train_logprob_abs_diff": (gap * mask).sum() / live,
        "policy/rollout_train_k3_kl": (k3(logp, rollout_logp) * mask).sum() / live,
        "policy/rollout_train_ratio_beyond_2x": ((gap > math.log(2)) * mask).sum() / live,
    }
