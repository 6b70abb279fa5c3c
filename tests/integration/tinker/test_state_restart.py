"""``save_state`` -> a service restart -> ``create_training_client_from_state_with_optimizer`` continues
with identical results (runs last: it restarts the shared service)."""

import numpy as np
import tinker
from tinker import types

ADAM = types.AdamParams(learning_rate=2e-3, beta1=0.9, beta2=0.95, eps=1e-8)


def test_save_state_restart_load_state_continues_identically(service, trainer):
    tok = trainer.get_tokenizer()
    facts = []
    for a in range(3):
        ids = tok.encode(f"{a} * 2 = {2 * a}.")
        facts.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                 loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)}))
    path = trainer.save_state("ckpt").result().path
    assert path.endswith("/weights/ckpt")
    first = [trainer.forward_backward(facts, "cross_entropy").result(), trainer.optim_step(ADAM).result()]
    after = trainer.forward(facts, "cross_entropy").result()
    service.restart()
    with tinker.ServiceClient(base_url=service.url) as fresh:
        resumed = fresh.create_training_client_from_state_with_optimizer(path).result()
        again = [resumed.forward_backward(facts, "cross_entropy").result(), resumed.optim_step(ADAM).result()]
        after_again = resumed.forward(facts, "cross_entropy").result()
    assert again[0].metrics["loss:sum"] == first[0].metrics["loss:sum"]
    for a, b in zip(after.loss_fn_outputs, after_again.loss_fn_outputs):
        np.testing.assert_array_equal(a["logprobs"].to_numpy(), b["logprobs"].to_numpy())
