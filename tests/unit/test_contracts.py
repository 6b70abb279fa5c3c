"""Every bad input the ledger contract names raises a ValueError naming the trajectory and field."""

import math

import pytest
import torch

from correction.routing_replay import RoutedExperts
from megatron_rl.contracts import (
    FAILED,
    ContractError,
    GeneratorInput,
    GeneratorOutput,
    PromptItem,
    TrainingBatch,
    Trajectory,
    TrajectoryId,
    from_record,
    to_record,
)


def make(**overrides) -> Trajectory:
    fields = dict(
        trajectory_id=TrajectoryId("q7", 1),
        prompt_token_ids=[5, 6, 7],
        response_ids=[10, 11, 12, 13],
        loss_mask=[1, 1, 0, 1],
        rewards=1.0,
        rollout_logprobs=[-0.5, -1.0, 0.0, -2.0],
        policy_versions=[3, 3, 3, 4],
    )
    fields.update(overrides)
    return Trajectory(**fields)


def expect(field: str, **overrides):
    with pytest.raises(ContractError) as err:
        make(**overrides)
    assert err.value.field == field and err.value.trajectory == "q7#1"
    assert "q7#1" in str(err.value) and field in str(err.value)


def test_valid_record_round_trips_through_the_ledger():
    experts = RoutedExperts(torch.tensor([[[0, 1]], [[2, 3]]] * 3 + [[[1, 2]]]), num_experts=4)
    t = make(rewards=[0.0, 0.0, 0.0, 1.0], routed_experts=experts, timing={"llm": 0.5, "env": 0.1})
    back = from_record(to_record(t))
    assert back.policy_versions == [3, 3, 3, 4]
    assert to_record(back) == to_record(t)
    assert torch.equal(back.routed_experts.indices, experts.indices)
    assert to_record(t)["policy_versions"] == [[3, 0, 3], [4, 3, 4]]


@pytest.mark.parametrize("field", ["loss_mask", "rollout_logprobs", "policy_versions", "rewards"])
def test_unequal_lengths(field):
    value = [1.0] * 3 if field == "rewards" else [1] * 3
    expect(field, **{field: value})


def test_empty_response():
    expect("response_ids", response_ids=[], loss_mask=[], rollout_logprobs=[], policy_versions=[])


@pytest.mark.parametrize("bad", [2, -1, 0.5])
def test_non_binary_mask(bad):
    expect("loss_mask", loss_mask=[1, bad, 0, 1])


def test_all_zero_mask_is_refused_unless_the_rollout_failed():
    expect("loss_mask", loss_mask=[0, 0, 0, 0])
    assert make(loss_mask=[0, 0, 0, 0], rewards=0.0, stop_reason=FAILED).stop_reason == FAILED


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_rewards(bad):
    expect("rewards", rewards=bad)
    expect("rewards", rewards=[0.0, bad, 0.0, 0.0])


def test_non_finite_logprob_on_a_sampled_token():
    expect("rollout_logprobs", rollout_logprobs=[-0.5, math.nan, 0.0, -2.0])
    # Masked-out tokens (observations) carry no sampler log-prob and are not checked.
    make(rollout_logprobs=[-0.5, -1.0, math.nan, -2.0])


@pytest.mark.parametrize("field,value", [("prompt_token_ids", [5, 99, 7]), ("response_ids", [10, -1, 12, 13])])
def test_token_ids_outside_the_vocabulary(field, value):
    t = make(**{field: value})
    with pytest.raises(ContractError) as err:
        t.validate(vocab_size=64)
    assert err.value.field == field


def test_routed_experts_must_cover_prompt_and_response():
    with pytest.raises(ValueError, match="q7#1.*routed_experts"):
        make(routed_experts=RoutedExperts(torch.zeros(4, 1, 2, dtype=torch.long) + torch.tensor([0, 1]), 4))


def test_duplicate_trajectory_ids_in_an_output():
    with pytest.raises(ContractError) as err:
        GeneratorOutput([make(), make()])
    assert err.value.field == "trajectory_id" and err.value.trajectory == "q7#1"


def test_duplicate_instance_ids_in_an_input():
    item = PromptItem("q7", [{"role": "user", "content": "1+1"}], "arithmetic")
    with pytest.raises(ContractError, match="q7"):
        GeneratorInput([item, item], n_samples_per_prompt=2, step=0, policy_version=0)


def test_output_must_match_the_input_order():
    item = PromptItem("q7", [{"role": "user", "content": "1+1"}], "arithmetic")
    gi = GeneratorInput([item], n_samples_per_prompt=2, step=0, policy_version=0)
    first, second = make(trajectory_id=TrajectoryId("q7", 0)), make(trajectory_id=TrajectoryId("q7", 1))
    GeneratorOutput([first, second]).check_matches(gi)
    with pytest.raises(ContractError, match="order"):
        GeneratorOutput([second, first]).check_matches(gi)


def test_training_batch_collates_response_positions():
    a, b = make(), make(trajectory_id=TrajectoryId("q8", 0), response_ids=[20, 21], loss_mask=[1, 1],
                        rollout_logprobs=[-1.0, -1.0], policy_versions=[4, 4])
    batch = TrainingBatch.from_trajectories([a, b], [torch.ones(4), torch.full((2,), -1.0)], [0, 1], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 10, 11, 12, 13], [5, 6, 7, 20, 21, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 1], [0, 0, 0, 1, 1, 0, 0]]
    assert batch.advantages[1].tolist() == [0, 0, 0, -1, -1, 0, 0]
    small = batch.select([1])
    assert small.input_ids.shape == (1, 5) and small.trajectory_ids == ["q8#0"]


def test_training_batch_keeps_its_sampling_temperature_and_refuses_zero():
    batch = TrainingBatch.from_trajectories([make()], [torch.ones(4)], [0], pad_token_id=0, temperature=0.7)
    assert batch.temperature == 0.7 and batch.select([0]).temperature == 0.7
    with pytest.raises(ContractError) as err:
        TrainingBatch.from_trajectories([make()], [torch.ones(4)], [0], pad_token_id=0, temperature=0.0)
    assert err.value.field == "temperature"


def test_training_batch_rejects_a_non_finite_advantage_on_a_live_token():
    with pytest.raises(ContractError) as err:
        TrainingBatch.from_trajectories([make()], [torch.tensor([0.0, math.nan, 0.0, 0.0])], [0], pad_token_id=0)
    assert err.value.field == "advantages" and err.value.trajectory == "q7#1"
    # NaN on a masked-out observation token is not a violation.
    TrainingBatch.from_trajectories([make()], [torch.tensor([0.0, 0.0, math.nan, 0.0])], [0], pad_token_id=0)
