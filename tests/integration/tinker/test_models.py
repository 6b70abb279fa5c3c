"""Several training clients on one service: each is a model of its own (weights, Adam state, step count)
that starts from the base checkpoint; they take turns on the trainer ranks, parked on disk in between."""

import numpy as np
import pytest
import torch
import transformers
from tinker import types

ADAM = types.AdamParams(learning_rate=2e-3, beta1=0.9, beta2=0.95, eps=1e-8)


def _data(tok, texts: list[str]) -> list[types.Datum]:
    ids = [tok.encode(t) for t in texts]
    return [types.Datum(model_input=types.ModelInput.from_ints(i[:-1]),
                        loss_fn_inputs={"target_tokens": i[1:], "weights": [1.0] * (len(i) - 1)}) for i in ids]


def _logprobs(client, data) -> np.ndarray:
    return np.concatenate([o["logprobs"].to_numpy() for o in client.forward(data, "cross_entropy").result().loss_fn_outputs])


def _step(client, data) -> float:
    client.forward_backward(data, "cross_entropy").result()
    return client.optim_step(ADAM).result().metrics["step"]


def _hf_logprobs(model_dir, data) -> np.ndarray:
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    out = []
    with torch.no_grad():
        for d in data:
            ids = list(d.model_input.to_ints()) + [int(d.loss_fn_inputs["target_tokens"].to_numpy()[-1])]
            logp = hf(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
            out.append(logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy())
    return np.concatenate(out)


def test_each_training_client_is_a_model_of_its_own(service, sdk):
    a = sdk.create_lora_training_client(base_model="model", rank=8).result()
    b = sdk.create_lora_training_client(base_model="model", rank=8).result()
    tok = a.get_tokenizer()
    facts = _data(tok, [f"{x} + {y} = {x + y}." for x in range(3) for y in range(3)])
    other = _data(tok, [f"{x} - {x} = 0." for x in range(5)])

    base = _logprobs(a, facts)  # a new model starts from the checkpoint, whatever the service trained before
    np.testing.assert_allclose(base, _hf_logprobs(service.model, facts), atol=2e-4)
    assert [_step(a, facts) for _ in range(3)] == [1, 2, 3]
    trained = _logprobs(a, facts)
    assert np.abs(trained - base).max() > 1e-2

    np.testing.assert_array_equal(_logprobs(b, facts), base)  # b is untouched by a's steps
    assert _step(b, other) == 1  # its own step count (and Adam state)
    np.testing.assert_array_equal(_logprobs(a, facts), trained)  # a comes back from its parked state
    assert _step(a, facts) == 4


def test_a_model_with_unapplied_gradients_keeps_the_trainer(sdk):
    a = sdk.create_lora_training_client(base_model="model", rank=8).result()
    b = sdk.create_lora_training_client(base_model="model", rank=8).result()
    facts = _data(a.get_tokenizer(), ["1 + 1 = 2.", "2 + 2 = 4."])
    b.forward(facts, "cross_entropy").result()
    a.forward_backward(facts, "cross_entropy").result()
    with pytest.raises(Exception, match="holds gradients of model .* that no optim_step has applied"):
        b.forward(facts, "cross_entropy").result()
    a.optim_step(ADAM).result()
    b.forward(facts, "cross_entropy").result()


def test_a_model_loaded_from_saved_state_keeps_it_across_turns(sdk):
    a = sdk.create_lora_training_client(base_model="model", rank=8).result()
    facts = _data(a.get_tokenizer(), ["3 + 3 = 6.", "4 + 4 = 8."])
    _step(a, facts)
    saved = _logprobs(a, facts)
    c = sdk.create_training_client_from_state(a.save_state("turns").result().path).result()
    _step(a, facts)
    np.testing.assert_array_equal(_logprobs(c, facts), saved)  # c took no step: it comes back from the saved state
    assert _step(c, facts) == 2
