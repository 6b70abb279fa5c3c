"""Tinker's losses against hand-computed numbers; the request checks of serve-training that need no
trainer: datums to rows (shift, lengths, masks), loss_fn_config onto algorithm.*, LoRA and model refusals."""

import math

import numpy as np
import pytest
import torch

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.tinker.batch import to_batch
from megatron_rl.tinker.losses import algorithm_for, check_loss, cross_entropy, importance_sampling, ppo
from megatron_rl.tinker.wire import DatumIn


def test_cross_entropy_is_the_weighted_negative_log_likelihood_sum():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    w = torch.tensor([[0.0, 1.0, 2.0]])
    assert cross_entropy(logp, w).sum().item() == pytest.approx(2.0 + 1.0)


def test_importance_sampling_weights_the_advantage_by_p_over_q():
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]])
    q = torch.tensor([[math.log(0.25), math.log(0.2)]])
    adv = torch.tensor([[1.0, -2.0]])
    # ratios 2 and 1: -(2 * 1) - (1 * -2) = 0
    assert importance_sampling(logp, q, adv).tolist()[0] == pytest.approx([-2.0, 2.0])


def test_ppo_clips_the_ratio_on_the_side_that_would_gain():
    logp = torch.tensor([[math.log(0.6), math.log(0.6), math.log(0.1)]])
    q = torch.tensor([[math.log(0.3), math.log(0.3), math.log(0.2)]])
    adv = torch.tensor([[1.0, -1.0, -1.0]])
    # r = 2, 2, 0.5 -> clip to [0.8, 1.2]: A>0 takes min(2, 1.2)=1.2; A<0 takes max: -min(-2, -1.2) = 2; r=0.5, A<0: -min(-0.5, -0.8) = 0.8
    assert ppo(logp, q, adv, 0.8, 1.2).tolist()[0] == pytest.approx([-1.2, 2.0, 0.8])


def test_registered_losses_take_their_config_onto_the_algorithm():
    algo = algorithm_for("gspo", {"eps_clip_low": 0.001, "correction.tis_ratio_type": "token"}, AlgorithmConfig())
    assert algo.policy_loss_type == "gspo" and algo.eps_clip_low == 0.001
    assert algo.correction.tis_ratio_type == "token"
    with pytest.raises(ValueError, match="loss_fn_config.correction.nope: unknown key"):
        algorithm_for("cispo", {"correction.nope": 1.0}, AlgorithmConfig())
    with pytest.raises(ValueError, match="loss_fn: unknown loss 'grpo_plus'"):
        check_loss("grpo_plus", {}, AlgorithmConfig())
    with pytest.raises(ValueError, match="loss_fn_config.kl_coeff: ppo takes only"):
        check_loss("ppo", {"kl_coeff": 0.1}, AlgorithmConfig())


def _datum(tokens, **inputs):
    return DatumIn(tokens, {k: np.asarray(v) for k, v in inputs.items()})


def test_datums_become_shifted_rows_with_the_inputs_on_the_target_positions():
    b = to_batch([_datum([5, 6, 7], target_tokens=[6, 7, 8], weights=[0.0, 1.0, 1.0]),
                  _datum([9], target_tokens=[4], weights=[2.0])], "cross_entropy", 100, 64, 0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8], [9, 4, 0, 0]]
    assert b.advantages.tolist() == [[0, 0, 1, 1], [0, 2, 0, 0]]
    assert b.loss_mask.tolist() == [[0, 1, 1, 1], [0, 1, 0, 0]]
    rl = to_batch([_datum([5, 6, 7], target_tokens=[6, 7, 8], logprobs=[0, -1.5, -0.5], advantages=[0, 1, 1])],
                  "gspo", 100, 64, 0)
    assert rl.loss_mask.tolist() == [[0, 0, 1, 1]] and rl.rollout_logprobs.tolist() == [[0, 0, -1.5, -0.5]]


@pytest.mark.parametrize("datum, loss, message", [
    (_datum([5, 6], target_tokens=[7, 8]), "cross_entropy", r"data\[0\].loss_fn_inputs.target_tokens: must be model_input shifted"),
    (_datum([5, 6], target_tokens=[6, 7], weights=[1.0]), "cross_entropy", r"data\[0\].loss_fn_inputs.weights: has 1 values"),
    (_datum([5, 6], target_tokens=[6, 700]), "cross_entropy", r"data\[0\]: token id outside the vocabulary"),
    (_datum([5, 6], target_tokens=[6, 7], advantages=[1, 1]), "ppo", r"data\[0\].loss_fn_inputs.logprobs: required by loss_fn=ppo"),
    (_datum([5, 6], target_tokens=[6, 7], logprobs=[0, float("nan")], advantages=[1, 1]), "ppo", "non-finite"),
    (_datum([5, 6], target_tokens=[6, 7], bonus=[1, 1]), "cross_entropy", r"data\[0\].loss_fn_inputs.bonus: unknown input"),
])
def test_bad_datums_are_refused_naming_the_field(datum, loss, message):
    with pytest.raises(ValueError, match=message):
        to_batch([datum], loss, 100, 64, 0)


def test_lora_and_other_models_are_refused(tmp_path):
    from megatron_rl.config import load_config
    from megatron_rl.tinker.service import Refused, TrainingService
    from megatron_rl.tiny import make_tiny_model

    model = make_tiny_model("qwen3", tmp_path / "m", size="unit")
    cfg = load_config([f"model.path={model}"])
    service = TrainingService(cfg, tmp_path / "state")
    with pytest.raises(Refused, match="lora_config.rank: LoRA is not supported"):
        service.create_model("s", 0, "m", {"rank": 32})
    with pytest.raises(Refused, match="base_model: this service trains 'm'"):
        service.create_model("s", 0, "Qwen/Qwen3-8B", None)
    assert service.create_model("s", 0, str(model), None) == "s:train:0"
    assert service.create_model("s", 1, "m", None) == "s:train:1"  # a second training client: a model of its own
    with pytest.raises(Refused, match="model_id: unknown model 's:train:2'"):
        service.check_model("s:train:2")
    full = TrainingService(cfg, tmp_path / "state", lora_as_full=True)
    assert full.create_model("s", 0, "m", {"rank": 32}) == "s:train:0"
