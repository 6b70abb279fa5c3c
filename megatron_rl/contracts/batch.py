"""The batch types handed between phases: GeneratorInput → GeneratorOutput → TrainingBatch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from correction.routing_replay import RoutedExperts
from megatron_rl.contracts.errors import ContractError
from megatron_rl.contracts.trajectory import Trajectory, TrajectoryId


@dataclass
class PromptItem:
    """One dataset row to roll out: chat messages, the environment that scores them, its extras."""

    instance_id: str
    prompt: list[dict]
    env_class: str
    env_extras: dict = field(default_factory=dict)
    data_source: str | None = None
    """Where the row came from (SkyRL/veRL ``data_source``); recorded in the ledger."""
    extra_info: dict = field(default_factory=dict)
    """SkyRL/veRL ``extra_info``, kept as given (split, index, ...)."""


@dataclass
class GeneratorInput:
    """A batch of prompts, each sampled ``n_samples_per_prompt`` times into one group."""

    prompts: list[PromptItem]
    n_samples_per_prompt: int
    step: int
    """The training step these groups are scheduled for."""
    policy_version: int
    """The weight version the fleet serves when generation starts."""

    def __post_init__(self) -> None:
        if self.n_samples_per_prompt < 1:
            raise ValueError(f"generator input: n_samples_per_prompt must be >= 1, got {self.n_samples_per_prompt}")
        if not self.prompts:
            raise ValueError("generator input: no prompts")
        seen: set[str] = set()
        for p in self.prompts:
            if p.instance_id in seen:
                raise ContractError(p.instance_id, "instance_id", "appears twice in one batch")
            seen.add(p.instance_id)

    def trajectory_ids(self) -> list[TrajectoryId]:
        """Expected output ids in order: prompt-major, repetition-minor."""
        return [TrajectoryId(p.instance_id, r) for p in self.prompts for r in range(self.n_samples_per_prompt)]


@dataclass
class GeneratorOutput:
    """Trajectories in input order plus the generation metrics of the batch."""

    trajectories: list[Trajectory]
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[TrajectoryId] = set()
        for t in self.trajectories:
            if t.trajectory_id in seen:
                raise ContractError(t.name, "trajectory_id", "appears twice in one batch")
            seen.add(t.trajectory_id)

    def check_matches(self, expected: GeneratorInput, vocab_size: int | None = None) -> None:
        """Raise unless this output holds exactly the input's trajectories, in order, in vocabulary."""
        got = [t.trajectory_id for t in self.trajectories]
        want = expected.trajectory_ids()
        if got != want:
            missing = sorted(set(map(str, want)) - set(map(str, got)))[:3]
            extra = sorted(set(map(str, got)) - set(map(str, want)))[:3]
            raise ContractError(
                str((missing or extra or [got[0]])[0]), "trajectory_id",
                f"output does not match input order (missing {missing}, unexpected {extra})",
            )
        for t in self.trajectories:
            t.validate(vocab_size)


_PER_TOKEN = ("attention_mask", "loss_mask", "advantages", "rollout_logprobs", "old_logprobs", "ref_logprobs")


@dataclass
class TrainingBatch:
    """Right-padded rows ``[B, T]`` of prompt + response; per-token tensors align with ``input_ids``.

    A position ``t`` with ``loss_mask[b, t] == 1`` is a sampled token whose log-probability the model
    computes from the logits at ``t - 1``; ``rollout_logprobs[b, t]`` is the sampler's value for it.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    rollout_logprobs: torch.Tensor
    group_ids: torch.Tensor
    """``[B]``: rows that share a prompt share an id."""
    trajectory_ids: list[str]
    prompt_lengths: torch.Tensor
    """``[B]``: prompt tokens at the start of each row."""
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    routed_experts: list[RoutedExperts | None] | None = None
    temperature: float = 1.0
    """The temperature the rows were sampled at: every log-prob pass over them (policy, old, reference) divides
    the logits by it, so the trainer's log-probs are of the distribution the sampler drew from (vLLM returns
    processed log-probs, ``server_command``)."""

    def __post_init__(self) -> None:
        _validate_batch(self)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def select(self, rows: list[int] | torch.Tensor) -> TrainingBatch:
        """The sub-batch of the given rows (for micro-batching), trimmed to its longest row."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[idx].sum(dim=1).max())
        cut = lambda x: None if x is None else x[idx, :width]  # noqa: E731
        return TrainingBatch(
            input_ids=cut(self.input_ids),
            attention_mask=cut(self.attention_mask),
            loss_mask=cut(self.loss_mask),
            advantages=cut(self.advantages),
            rollout_logprobs=cut(self.rollout_logprobs),
            group_ids=self.group_ids[idx],
            trajectory_ids=[self.trajectory_ids[i] for i in idx.tolist()],
            prompt_lengths=self.prompt_lengths[idx],
            old_logprobs=cut(self.old_logprobs),
            ref_logprobs=cut(self.ref_logprobs),
            routed_experts=None if self.routed_experts is None else [self.routed_experts[i] for i in idx.tolist()],
            temperature=self.temperature,
        )

    @classmethod
    def from_trajectories(
        cls, trajectories: list[Trajectory], advantages: list[torch.Tensor], group_ids: list[int], pad_token_id: int,
        temperature: float = 1.0,
    ) -> TrainingBatch:
        """Collate ledger records and their per-response-token advantages into padded rows."""
        if len(advantages) != len(trajectories) or len(group_ids) != len(trajectories):
            raise ValueError("training batch: need one advantages tensor and one group id per trajectory")
        width = max(t.num_tokens for t in trajectories)
        rows = len(trajectories)
        ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
        attn, mask, adv, logp = (torch.zeros(rows, width) for _ in range(4))
        for b, (t, a) in enumerate(zip(trajectories, advantages)):
            p, n = len(t.prompt_token_ids), t.num_tokens
            ids[b, :n] = torch.tensor(t.prompt_token_ids + t.response_ids)
            attn[b, :n] = 1
            mask[b, p:n] = torch.tensor(t.loss_mask, dtype=torch.float32)
            adv[b, p:n] = torch.as_tensor(a, dtype=torch.float32)
            logp[b, p:n] = torch.tensor(t.rollout_logprobs, dtype=torch.float32)
        experts = [t.routed_experts for t in trajectories]
        return cls(
            input_ids=ids,
            attention_mask=attn,
            loss_mask=mask,
            advantages=adv,
            rollout_logprobs=logp,
            group_ids=torch.tensor(group_ids, dtype=torch.long),
            trajectory_ids=[t.name for t in trajectories],
            prompt_lengths=torch.tensor([len(t.prompt_token_ids) for t in trajectories]),
            routed_experts=experts if any(e is not None for e in experts) else None,
            temperature=temperature,
        )


def _validate_batch(b: TrainingBatch) -> None:
    if not b.temperature > 0:
        raise ContractError("batch", "temperature", f"must be > 0 (greedy rows are scored at 1.0), got {b.temperature}")
    if b.input_ids.dim() != 2:
        raise ContractError("batch", "input_ids", f"must be [B, T], got shape {tuple(b.input_ids.shape)}")
    rows, width = b.input_ids.shape
    if len(b.trajectory_ids) != rows or len(set(b.trajectory_ids)) != rows:
        raise ContractError("batch", "trajectory_ids", f"need {rows} distinct ids, got {len(set(b.trajectory_ids))}")
    for name in _PER_TOKEN:
        x = getattr(b, name)
        if x is not None and tuple(x.shape) != (rows, width):
            raise ContractError("batch", name, f"has shape {tuple(x.shape)}, input_ids has {(rows, width)}")
    for name in ("group_ids", "prompt_lengths"):
        if tuple(getattr(b, name).shape) != (rows,):
            raise ContractError("batch", name, f"must have shape ({rows},)")
    for name in ("attention_mask", "loss_mask"):
        x = getattr(b, name)
        if not bool(((x == 0) | (x == 1)).all()):
            raise ContractError("batch", name, "must hold only 0/1")
    live = b.loss_mask.bool()
    for name in ("advantages", "rollout_logprobs", "old_logprobs", "ref_logprobs"):
        x = getattr(b, name)
        if x is not None and not bool(torch.isfinite(x[live]).all()):
            row = int(torch.nonzero(~torch.isfinite(torch.where(live, x, 0.0)))[0, 0])
            raise ContractError(b.trajectory_ids[row], name, "is not finite on a masked-in token")
    if bool((b.loss_mask > b.attention_mask).any()):
        row = int(torch.nonzero(b.loss_mask > b.attention_mask)[0, 0])
        raise ContractError(b.trajectory_ids[row], "loss_mask", "is 1 on a padding position")
