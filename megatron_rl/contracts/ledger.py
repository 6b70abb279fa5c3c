"""The JSON form of a trajectory (one line of ``trajectories.jsonl``) and its inverse."""

from __future__ import annotations

from correction.routing_replay import RoutedExperts
from megatron_rl.contracts.trajectory import Trajectory, TrajectoryId


def version_spans(versions: list[int]) -> list[list[int]]:
    """Run-length form of per-token versions: ``[[version, start, end), ...]``."""
    spans: list[list[int]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1][0] == v:
            spans[-1][2] = i + 1
        else:
            spans.append([v, i, i + 1])
    return spans


def expand_spans(spans: list[list[int]]) -> list[int]:
    return [v for v, start, end in spans for _ in range(start, end)]


def to_record(t: Trajectory) -> dict:
    """A JSON-safe dict holding every ledger field; ``from_record`` restores it exactly."""
    return {
        "trajectory_id": str(t.trajectory_id),
        "prompt_token_ids": t.prompt_token_ids,
        "response_ids": t.response_ids,
        "loss_mask": t.loss_mask,
        "rewards": t.rewards,
        "rollout_logprobs": t.rollout_logprobs,
        "policy_versions": version_spans(t.policy_versions),
        "group_step": t.group_step,
        "stop_reason": t.stop_reason,
        "timing": t.timing,
        "env_metrics": t.env_metrics,
        "env_revision": t.env_revision,
        "data_source": t.data_source,
        "routed_experts": t.routed_experts.to_compact() if t.routed_experts is not None else None,
    }


def from_record(r: dict) -> Trajectory:
    experts = r.get("routed_experts")
    return Trajectory(
        trajectory_id=TrajectoryId.parse(r["trajectory_id"]),
        prompt_token_ids=r["prompt_token_ids"],
        response_ids=r["response_ids"],
        loss_mask=r["loss_mask"],
        rewards=r["rewards"],
        rollout_logprobs=r["rollout_logprobs"],
        policy_versions=expand_spans(r["policy_versions"]),
        group_step=r["group_step"],
        stop_reason=r["stop_reason"],
        timing=r["timing"],
        env_metrics=r["env_metrics"],
        env_revision=r["env_revision"],
        data_source=r.get("data_source"),
        routed_experts=RoutedExperts.from_compact(experts) if experts else None,
    )
