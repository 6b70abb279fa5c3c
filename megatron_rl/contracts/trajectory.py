"""One trajectory's ledger record: exact token ids, masks, rewards, log-probs, versions, identity."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from correction.routing_replay import RoutedExperts
from megatron_rl.contracts.errors import ContractError

# A failed rollout (environment error after all retries) is kept in the ledger with its loss mask
# and rewards zeroed so that it stays out of the gradient and the baseline; only it may have an
# all-zero mask.
FAILED = "failed"


@dataclass(frozen=True, order=True)
class TrajectoryId:
    """(instance id, repetition index): unique, stable across retries and resume."""

    instance_id: str
    repetition: int

    def __str__(self) -> str:
        return f"{self.instance_id}#{self.repetition}"

    @classmethod
    def parse(cls, text: str) -> TrajectoryId:
        instance, sep, rep = text.rpartition("#")
        if not sep or not rep.isdigit():
            raise ValueError(f"trajectory id {text!r}: expected '<instance_id>#<repetition>'")
        return cls(instance, int(rep))


@dataclass
class Trajectory:
    """Per-token arrays aligned with ``response_ids`` plus identity and provenance.

    Validated on construction; a violation raises :class:`ContractError` and is never repaired.
    """

    trajectory_id: TrajectoryId
    prompt_token_ids: list[int]
    """Token ids of the prompt exactly as the sampler saw them."""
    response_ids: list[int]
    """Sampled tokens and appended observation tokens, in order, never re-tokenised."""
    loss_mask: list[int]
    """1 for sampled action tokens, 0 for observations, tool output and template tokens."""
    rewards: float | list[float]
    """One scalar, or one value per response token (per-turn rewards on each turn's last token)."""
    rollout_logprobs: list[float]
    """The sampler's log-probability of each sampled token (0 where the mask is 0)."""
    policy_versions: list[int]
    """Weight version that produced each response token (observations carry the turn's version)."""
    group_step: int = 0
    """The scheduled training step of this trajectory's group (not the same fact as the versions)."""
    stop_reason: str = "stop"
    """Why the episode ended: stop, length, max_turns, max_input_length, abort, failed, ..."""
    timing: dict[str, float] = field(default_factory=dict)
    """Seconds split by phase: ``llm`` and ``env``."""
    env_metrics: dict[str, float] = field(default_factory=dict)
    env_revision: str | None = None
    data_source: str | None = None
    """The dataset row's ``data_source`` (SkyRL/veRL rows), when it has one."""
    routed_experts: RoutedExperts | None = None
    """MoE only: experts per token (prompt + response) and layer, from the sampler (R3)."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def name(self) -> str:
        return str(self.trajectory_id)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.response_ids)

    def validate(self, vocab_size: int | None = None) -> None:
        """Check every field; ``vocab_size`` adds the range check of the token ids."""
        _check_lengths(self)
        _check_mask(self)
        _check_rewards(self)
        _check_logprobs(self)
        if vocab_size is not None:
            _check_vocab(self, vocab_size)
        if self.routed_experts is not None:
            self.routed_experts.validate(self.num_tokens, f"trajectory {self.name}: field 'routed_experts'")

    def reward_sum(self) -> float:
        return float(self.rewards) if _is_scalar(self.rewards) else float(sum(self.rewards))


def _is_scalar(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_lengths(t: Trajectory) -> None:
    if not t.prompt_token_ids:
        raise ContractError(t.name, "prompt_token_ids", "is empty")
    if not t.response_ids:
        raise ContractError(t.name, "response_ids", "is empty")
    n = len(t.response_ids)
    per_token = {"loss_mask": t.loss_mask, "rollout_logprobs": t.rollout_logprobs, "policy_versions": t.policy_versions}
    if not _is_scalar(t.rewards):
        per_token["rewards"] = t.rewards
    for name, values in per_token.items():
        if len(values) != n:
            raise ContractError(t.name, name, f"has length {len(values)}, response_ids has {n}")


def _check_mask(t: Trajectory) -> None:
    bad = [m for m in t.loss_mask if m not in (0, 1)]
    if bad:
        raise ContractError(t.name, "loss_mask", f"must hold only 0/1, found {bad[0]!r}")
    if not any(t.loss_mask) and t.stop_reason != FAILED:
        raise ContractError(t.name, "loss_mask", "is all zero: no sampled token to learn from")


def _check_rewards(t: Trajectory) -> None:
    values = [t.rewards] if _is_scalar(t.rewards) else t.rewards
    if not isinstance(values, list):
        raise ContractError(t.name, "rewards", f"must be a float or a list of floats, got {type(t.rewards).__name__}")
    for v in values:
        if not _is_scalar(v) or not math.isfinite(v):
            raise ContractError(t.name, "rewards", f"must be finite numbers, found {v!r}")


def _check_logprobs(t: Trajectory) -> None:
    for i, (lp, m) in enumerate(zip(t.rollout_logprobs, t.loss_mask)):
        if m and not (math.isfinite(lp) and lp <= 0.0):
            raise ContractError(t.name, "rollout_logprobs", f"token {i}: {lp!r} is not a finite log-probability")


def _check_vocab(t: Trajectory, vocab_size: int) -> None:
    for name in ("prompt_token_ids", "response_ids"):
        for i, tok in enumerate(getattr(t, name)):
            if not isinstance(tok, int) or not 0 <= tok < vocab_size:
                raise ContractError(t.name, name, f"token {i}: id {tok!r} outside the vocabulary [0, {vocab_size})")
