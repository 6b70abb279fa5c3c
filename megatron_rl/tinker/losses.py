"""Tinker's built-in losses as pure tensor functions, and the project's registered policy losses
configured from a request.

Tinker's own losses (``cross_entropy``, ``importance_sampling``, ``ppo``) are sums over tokens, as
Tinker defines them: each returns the per-token loss ``[B, T]`` whose sum is the loss. Any other name
is a loss registered in ``megatron_rl.algorithms`` (``gspo``, ``cispo``, ``sapo``, ``dual_clip``,
...), run through ``policy_update_loss`` with the corrections (TIS, sequence/token masks) and the
aggregation the request's ``loss_fn_config`` sets on top of ``algorithm.*`` of the service.
"""

from __future__ import annotations

import dataclasses

import torch

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.algorithms.registry import POLICY_LOSSES

TINKER_LOSSES = ("cross_entropy", "importance_sampling", "ppo")
PPO_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


def cross_entropy(logp: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """-weights * log p(target)."""
    return -weights * logp


def importance_sampling(logp: torch.Tensor, sampler_logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """-(p / q) * A with q the sampler's probability (the REINFORCE estimator, importance-weighted)."""
    return -torch.exp(logp - sampler_logp) * advantages


def ppo(logp: torch.Tensor, sampler_logp: torch.Tensor, advantages: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """-min(r A, clip(r, low, high) A), r = p / q."""
    ratio = torch.exp(logp - sampler_logp)
    return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)


def tinker_token_loss(name: str, logp, sampler_logp, advantages, config: dict) -> torch.Tensor:
    """Per-token loss of one of Tinker's own losses (``advantages`` carries ``weights`` for cross_entropy)."""
    if name == "cross_entropy":
        return cross_entropy(logp, advantages)
    if name == "importance_sampling":
        return importance_sampling(logp, sampler_logp, advantages)
    c = {**PPO_DEFAULTS, **config}
    return ppo(logp, sampler_logp, advantages, float(c["clip_low_threshold"]), float(c["clip_high_threshold"]))


def _override(obj, dotted: str, value, full: str):
    head, _, rest = dotted.partition(".")
    names = {f.name for f in dataclasses.fields(obj)}
    if head not in names:
        raise ValueError(f"loss_fn_config.{full}: unknown key; algorithm keys are {sorted(names)} "
                         "(nested ones dotted, e.g. correction.tis_ratio_type)")
    if rest:
        return dataclasses.replace(obj, **{head: _override(getattr(obj, head), rest, value, full)})
    current = getattr(obj, head)
    if isinstance(current, bool):
        value = bool(value)
    elif isinstance(current, int) and not isinstance(value, str):
        value = int(value)
    return dataclasses.replace(obj, **{head: value})


def algorithm_for(name: str, config: dict, base: AlgorithmConfig) -> AlgorithmConfig:
    """The service's algorithm with ``policy_loss_type=name`` and the request's ``loss_fn_config`` on top."""
    if name not in POLICY_LOSSES.names():
        raise ValueError(f"loss_fn: unknown loss {name!r}; this service runs {sorted(TINKER_LOSSES)} "
                         f"and the registered policy losses {sorted(POLICY_LOSSES.names())}")
    algo = dataclasses.replace(base, policy_loss_type=name)
    for key, value in config.items():
        algo = _override(algo, key, value, key)
    return algo


def check_loss(name: str, config: dict, base: AlgorithmConfig) -> None:
    """Raise ValueError naming the field when ``name`` or ``config`` cannot run."""
    if name in ("cross_entropy", "importance_sampling"):
        if config:
            raise ValueError(f"loss_fn_config: {name} takes no options, got {sorted(config)}")
    elif name == "ppo":
        extra = set(config) - set(PPO_DEFAULTS)
        if extra:
            raise ValueError(f"loss_fn_config.{sorted(extra)[0]}: ppo takes only {sorted(PPO_DEFAULTS)}")
    else:
        algorithm_for(name, config, base)
