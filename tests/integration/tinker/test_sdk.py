"""The official ``tinker`` SDK against ``megatron-rl serve-training``: supervised steps lower the loss,
the sampler's log-probs after an ephemeral sync equal the trainer's, bad requests are refused naming
the field."""

import numpy as np
import pytest
from tinker import types

ADAM = types.AdamParams(learning_rate=2e-3, beta1=0.9, beta2=0.95, eps=1e-8)


def _datum(ids: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})


@pytest.fixture(scope="module")
def facts(trainer):
    tok = trainer.get_tokenizer()
    return [_datum(tok.encode(f"{a} + {b} = {a + b}.")) for a in range(5) for b in range(5)]


def _mean_nll(out: types.ForwardBackwardOutput, data) -> float:
    logp = np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])
    w = np.concatenate([d.loss_fn_inputs["weights"].to_numpy() for d in data])
    return float(-(logp * w).sum() / w.sum())


def test_cross_entropy_steps_lower_the_loss(trainer, facts):
    losses = []
    for _ in range(6):
        out = trainer.forward_backward(facts, "cross_entropy").result()
        assert len(out.loss_fn_outputs) == len(facts)
        assert out.metrics["loss:sum"] == pytest.approx(_mean_nll(out, facts) * sum(len(d.loss_fn_inputs["weights"].to_numpy()) for d in facts), rel=1e-4)
        trainer.optim_step(ADAM).result()
        losses.append(_mean_nll(out, facts))
    assert losses[-1] < 0.7 * losses[0], losses


def test_forward_only_leaves_the_weights(trainer, facts):
    a = trainer.forward(facts[:3], "cross_entropy").result()
    b = trainer.forward(facts[:3], "cross_entropy").result()
    assert _mean_nll(a, facts[:3]) == _mean_nll(b, facts[:3])


def test_sampler_logprobs_match_the_trainer_after_an_ephemeral_sync(trainer, facts):
    trainer.forward_backward(facts, "cross_entropy").result()
    trainer.optim_step(ADAM).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tok = trainer.get_tokenizer()
    prompt = tok.encode("2 + 3 =")
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3,
                         sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)).result()
    assert len(res.sequences) == 3
    for seq in res.sequences:
        ids = prompt + list(seq.tokens)
        out = trainer.forward([_datum(ids)], "cross_entropy").result()
        train = out.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1:]
        assert len(seq.logprobs) == len(seq.tokens) == len(train)
        np.testing.assert_allclose(np.asarray(seq.logprobs), train, atol=2e-4)
    # prompt log-probs (the SDK's compute_logprobs) also come from the synced weights
    ids = prompt + list(res.sequences[0].tokens)
    fleet = sampler.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    train = trainer.forward([_datum(ids)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert fleet[0] is None
    np.testing.assert_allclose(np.asarray(fleet[1:], dtype=np.float32), train, atol=2e-4)


def test_bad_requests_are_refused_naming_the_field(sdk, trainer, facts):
    with pytest.raises(Exception, match="loss_fn: unknown loss 'nope'"):
        trainer.forward_backward(facts[:2], "nope").result()
    short = types.Datum(model_input=facts[0].model_input,
                        loss_fn_inputs={"target_tokens": facts[0].loss_fn_inputs["target_tokens"], "weights": [1.0]})
    with pytest.raises(Exception, match=r"data\[0\].loss_fn_inputs.weights: has 1 values"):
        trainer.forward_backward([short], "cross_entropy").result()
    with pytest.raises(Exception, match=r"data\[0\].loss_fn_inputs.logprobs: required by loss_fn=importance_sampling"):
        trainer.forward_backward(facts[:1], "importance_sampling").result()
    with pytest.raises(Exception, match="loss_fn_config.no_such_key: unknown key"):
        trainer.forward_backward(facts[:1], "gspo", loss_fn_config={"no_such_key": 1.0}).result()
    with pytest.raises(Exception, match="base_model: this service trains 'model'"):
        sdk.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=8).result()


def _rl_datum(ids, prompt_len, sampler_logprobs, advantage):
    n = len(ids) - 1
    adv = [0.0] * (prompt_len - 1) + [advantage] * (n - prompt_len + 1)
    lp = [0.0] * (prompt_len - 1) + list(sampler_logprobs)
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "logprobs": lp, "advantages": adv})


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo", "gspo", "cispo", "sapo"])
def test_policy_losses_take_advantages_and_sampler_logprobs(trainer, loss):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tok = trainer.get_tokenizer()
    prompt = tok.encode("4 + 1 =")
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)).result()
    data = [_rl_datum(prompt + list(s.tokens), len(prompt), s.logprobs, a) for s, a in zip(res.sequences, (1.0, -1.0))]
    out = trainer.forward_backward(data, loss).result()
    for d, o in zip(data, out.loss_fn_outputs):
        np.testing.assert_allclose(o["logprobs"].to_numpy()[len(prompt) - 1:],
                                   d.loss_fn_inputs["logprobs"].to_numpy()[len(prompt) - 1:], atol=2e-4)
    assert np.isfinite(out.metrics["loss:sum"])
    if loss in ("importance_sampling", "ppo"):  # on-policy: ratio 1, loss = -sum(advantages) over sampled tokens
        expected = -sum(d.loss_fn_inputs["advantages"].to_numpy().sum() for d in data)
        assert out.metrics["loss:sum"] == pytest.approx(expected, abs=1e-3)
    trainer.optim_step(ADAM).result()


def test_named_sampler_weights_are_an_hf_checkpoint_the_fleet_samples(service, sdk, trainer, facts):
    import torch
    import transformers

    path = trainer.save_weights_for_sampler("named").result().path
    model_id, kind, name = path.removeprefix("tinker://").split("/")
    folder = service.out / "tinker" / "serve_training" / "checkpoints" / model_id / kind / name
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    ids = list(facts[0].model_input.to_ints()) + [int(facts[0].loss_fn_inputs["target_tokens"].to_numpy()[-1])]
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
    hf_logp = logits.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()
    train = trainer.forward(facts[:1], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(hf_logp, train, atol=2e-4)
    sampler = sdk.create_sampling_client(model_path=path).result()
    res = sampler.sample(types.ModelInput.from_ints(ids[:3]), num_samples=1,
                         sampling_params=types.SamplingParams(max_tokens=3, temperature=1.0, seed=1)).result()
    assert len(res.sequences[0].tokens) == len(res.sequences[0].logprobs) > 0
