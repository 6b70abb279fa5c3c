"""The loop's batch preparation reads reference log-probs and critic values at the right positions:
response token t of a trajectory sits at prompt_length + t in the batch, and its advantages, KL
penalty and value targets must be the ones computed on response rows."""

from __future__ import annotations

import torch

from megatron_rl.algorithms.advantages import gae, reinforce_pp
from megatron_rl.algorithms.config import AlgorithmConfig, KLConfig
from megatron_rl.contracts import FAILED, GeneratorOutput, Trajectory, TrajectoryId
from megatron_rl.schedules.batching import to_training_batch


def _trajectory(i: int, prompt: int, mask: list[int], reward: float, stop_reason: str = "stop") -> Trajectory:
    n = len(mask)
    return Trajectory(
        trajectory_id=TrajectoryId(f"p{i}", 0),
        prompt_token_ids=list(range(5, 5 + prompt)),
        response_ids=list(range(40, 40 + n)),
        loss_mask=mask,
        rewards=reward,
        rollout_logprobs=[-0.1 * (k + 1) for k in range(n)],
        policy_versions=[0] * n,
        stop_reason=stop_reason,
    )


OUTPUT = GeneratorOutput([
    _trajectory(0, 3, [1, 1, 0, 0, 1], 1.0),  # an observation (mask 0) between two sampled turns
    _trajectory(1, 5, [1, 1], 0.0),
    _trajectory(2, 2, [1, 1, 1], 0.5),
])


class PositionScorer:
    """Reference log-prob and value at batch position p: distinct, position-dependent numbers."""

    def compute_ref_logprobs(self, batch):
        return -0.01 * torch.arange(batch.input_ids.shape[1]).float().expand_as(batch.loss_mask) * batch.attention_mask

    def compute_values(self, batch):
        return 0.1 * torch.arange(batch.input_ids.shape[1]).float().expand_as(batch.loss_mask) * batch.attention_mask


def _responses(full: torch.Tensor, batch) -> list[torch.Tensor]:
    return [full[b, p : p + len(t.response_ids)] for b, (p, t) in enumerate(zip(batch.prompt_lengths.tolist(), OUTPUT.trajectories))]


def test_gae_uses_the_values_of_each_response_token_position():
    config = AlgorithmConfig(advantage_estimator="gae", gamma=0.9, lambd=0.8)
    prepared = to_training_batch(OUTPUT, config, pad_token_id=0, scorer=PositionScorer())
    batch = prepared.batch
    width = max(len(t.response_ids) for t in OUTPUT.trajectories)
    rewards, mask, values = torch.zeros(3, width), torch.zeros(3, width), torch.zeros(3, width)
    for b, t in enumerate(OUTPUT.trajectories):
        n, p = len(t.response_ids), len(t.prompt_token_ids)
        rewards[b, n - 1], mask[b, :n] = t.rewards, torch.tensor(t.loss_mask, dtype=torch.float32)
        values[b, :n] = 0.1 * torch.arange(p, p + n)
    expected, _ = gae(rewards, mask, torch.arange(3), config, values=values)
    for b, got in enumerate(_responses(batch.advantages, batch)):
        assert torch.allclose(got, expected[b, : len(got)], atol=1e-6)
    assert torch.allclose(prepared.returns, (batch.advantages + prepared.values) * batch.loss_mask, atol=1e-6)
    assert torch.equal(prepared.values == 0, batch.loss_mask == 0), "values kept on live tokens only"
    assert batch.advantages[batch.attention_mask == 0].abs().sum() == 0


def test_kl_in_reward_penalises_each_token_by_rollout_minus_reference():
    kl = KLConfig(use_kl_in_reward=True, kl_reward_coef=0.5, kl_estimator_type="k1")
    config = AlgorithmConfig(advantage_estimator="reinforce_pp", gamma=1.0, kl=kl)
    prepared = to_training_batch(OUTPUT, config, pad_token_id=0, scorer=PositionScorer())
    batch = prepared.batch
    assert torch.equal(batch.ref_logprobs, PositionScorer().compute_ref_logprobs(batch))
    width = max(len(t.response_ids) for t in OUTPUT.trajectories)
    rewards, mask = torch.zeros(3, width), torch.zeros(3, width)
    for b, t in enumerate(OUTPUT.trajectories):
        n, p = len(t.response_ids), len(t.prompt_token_ids)
        mask[b, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        rewards[b, :n] = -0.5 * (torch.tensor(t.rollout_logprobs) + 0.01 * torch.arange(p, p + n)) * mask[b, :n]
        rewards[b, n - 1] += t.rewards
    expected, _ = reinforce_pp(rewards, mask, torch.arange(3), config)
    for b, got in enumerate(_responses(batch.advantages, batch)):
        assert torch.allclose(got, expected[b, : len(got)], atol=1e-5)
    kl_live = [(torch.tensor(t.rollout_logprobs) + 0.01 * torch.arange(len(t.prompt_token_ids), t.num_tokens))[
        torch.tensor(t.loss_mask, dtype=torch.bool)] for t in OUTPUT.trajectories]
    assert abs(prepared.metrics["reward/kl_penalty"] - 0.5 * float(torch.cat(kl_live).mean())) < 1e-6
    assert prepared.returns is None and prepared.values is None


def test_a_filtered_longest_trajectory_leaves_the_rest_aligned():
    """The output's longest response failed (no live token, so it is dropped); the kept rows are
    narrower than the reward rows and must still line up."""
    failed = _trajectory(9, 2, [0] * 9, 0.0, stop_reason=FAILED)
    output = GeneratorOutput(OUTPUT.trajectories + [failed])
    kl = KLConfig(use_kl_in_reward=True, kl_reward_coef=0.5, kl_estimator_type="k1")
    config = AlgorithmConfig(advantage_estimator="gae", gamma=0.9, lambd=0.8, kl=kl)
    prepared = to_training_batch(output, config, pad_token_id=0, scorer=PositionScorer())
    assert prepared.batch.num_rows == 3 and prepared.metrics["train/kept_trajectories"] == 3
    unfiltered = to_training_batch(OUTPUT, config, pad_token_id=0, scorer=PositionScorer())
    assert torch.allclose(prepared.batch.advantages, unfiltered.batch.advantages, atol=1e-6)
