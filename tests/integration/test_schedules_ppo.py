"""PPO mini-batches on a real megatron-core rank: later mini-batches see a ratio away from 1 and clip;
with R2 every mini-batch replays the experts the batch's starting weights chose."""

from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch

from megatron_rl.tiny import make_tiny_model


def _batch():
    """Four groups of two rows (advantage +1 and -1), 3-token prompts."""
    from megatron_rl.contracts import TrainingBatch

    g = torch.Generator().manual_seed(2)
    rows, width, prompt = 8, 10, 3
    attn = torch.ones(rows, width)
    loss = attn.clone()
    loss[:, :prompt] = 0
    sign = torch.tensor([1.0, -1.0] * 4)[:, None]
    return TrainingBatch(
        input_ids=torch.randint(3, 2000, (rows, width), generator=g), attention_mask=attn, loss_mask=loss,
        advantages=loss * sign, rollout_logprobs=torch.zeros(rows, width),
        group_ids=torch.arange(4).repeat_interleave(2), trajectory_ids=[f"t{b}" for b in range(rows)],
        prompt_lengths=torch.full((rows,), prompt),
    )


def _update(hf_dir: str, mini_batch_groups: int, replay: str, port: int) -> dict:
    from parallel import cpu_compat

    cpu_compat.enable()
    from correction.routing_replay import RoutingReplayConfig
    from megatron_rl.algorithms.config import AlgorithmConfig
    from megatron_rl.schedules.ppo_update import update_policy
    from parallel.config import OptimizerConfig, TrainerConfig
    from parallel.policy import MegatronPolicy

    algo = AlgorithmConfig(ppo_mini_batch_size=mini_batch_groups, routing_replay=RoutingReplayConfig(mode=replay))
    cfg = TrainerConfig(num_ranks=1, optimizer=OptimizerConfig(lr=1e-2, clip_grad=1.0))
    policy = MegatronPolicy(hf_dir, cfg, algo, 0, 1, f"tcp://127.0.0.1:{port}")
    batch = _batch()
    # sampled by these weights; an R2 policy replays unless asked to record, so route freely by recording
    logp, _, start = policy.compute_logprobs(batch, record_routing=replay == "r2")
    batch.rollout_logprobs = logp.float() * batch.loss_mask
    metrics = update_policy(policy, batch, algo)
    if start is not None:  # what the update replayed: the starting weights' experts, row by row
        metrics["replayed_the_start"] = all(torch.equal(a.indices, b.indices) for a, b in zip(start, batch.routed_experts))
    return metrics


def _in_fresh_process(*args) -> dict:
    """megatron-core keeps global state: one spawned process per update."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_update, (*args, port))


@pytest.fixture(scope="module")
def unit_model() -> str:
    return str(make_tiny_model("qwen3", size="unit", seed=0))


@pytest.fixture(scope="module")
def unit_moe_model() -> str:
    return str(make_tiny_model("qwen3_moe", size="unit", seed=0))


def test_four_mini_batches_clip_and_one_does_not(unit_model):
    four = _in_fresh_process(unit_model, 1, "none")
    assert four["policy/optimizer_steps"] == 4
    # The first mini-batch starts at the old weights (ratio 1); the next three do not.
    assert four["policy/ppo_clip_ratio_max"] > 0, four
    assert four["policy/ppo_kl_last"] != 0
    # The rollout log-probs are these weights' own: the first step measures no sampler/trainer gap, the
    # average over the four steps also counts the updates' change.
    assert four["policy/rollout_train_logprob_abs_diff_first"] < 1e-6 < four["policy/rollout_train_logprob_abs_diff"], four
    one = _in_fresh_process(unit_model, 0, "none")
    assert one["policy/optimizer_steps"] == 1
    assert one["policy/ppo_clip_ratio"] == 0 and one["policy/ppo_kl"] == pytest.approx(0, abs=1e-6)


def test_r2_replays_the_starting_experts_in_every_mini_batch(unit_moe_model):
    # Without the old-log-prob pass's record the R2 steps would be refused (a batch with no routed experts).
    four = _in_fresh_process(unit_moe_model, 1, "r2")
    assert four["policy/optimizer_steps"] == 4 and four["replayed_the_start"] is True
    assert four["policy/ppo_clip_ratio_max"] > 0, four
    # The routers' own choice moves away from the replayed start as the updates land (the GSPO paper's
    # expert change after an update); the first mini-batch runs on the starting weights.
    assert four["routing/disagreement_last"] > 0 and four["routing/tokens_differing_last"] > 0, four
    assert four["routing/disagreement"] < four["routing/disagreement_last"], four
