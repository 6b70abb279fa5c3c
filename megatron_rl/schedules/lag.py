"""How far off-policy a trained batch is: per-token and per-trajectory weight-version lag.

A token's lag is the trainer's weight version when it trains on the token minus the version that
sampled it (``Trajectory.policy_versions``); a trajectory resumed across a weight sync carries
several. A trajectory's staleness is the lag of its oldest sampled token.
"""

from __future__ import annotations

from collections import Counter

from megatron_rl.contracts import Trajectory


def token_lags(t: Trajectory, trainer_version: int) -> list[int]:
    """The lag of each sampled (loss-mask 1) token."""
    return [trainer_version - v for v, m in zip(t.policy_versions, t.loss_mask) if m]


def lag_metrics(trajectories: list[Trajectory], trainer_version: int) -> dict[str, float]:
    """``async/staleness_{mean,max,min}`` per trajectory, ``async/token_lag_mean`` and the token lag histogram."""
    per_token = [lag for t in trajectories for lag in token_lags(t, trainer_version)]
    per_traj = [max(token_lags(t, trainer_version), default=0) for t in trajectories]
    if not per_traj:
        return {}
    out = {
        "async/staleness_mean": sum(per_traj) / len(per_traj),
        "async/staleness_max": float(max(per_traj)),
        "async/staleness_min": float(min(per_traj)),
        "async/token_lag_mean": sum(per_token) / max(len(per_token), 1),
        "async/multi_version_trajectories": float(sum(len(set(t.policy_versions)) > 1 for t in trajectories)),
    }
    out.update({f"async/token_lag_hist/{lag}": float(n) for lag, n in sorted(Counter(per_token).items())})
    return out
