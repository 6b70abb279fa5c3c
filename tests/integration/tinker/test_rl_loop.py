"""An RL loop written only against the tinker SDK raises the reward on the arithmetic task:
sample -> reward (the arithmetic env's scorer) -> forward_backward(importance_sampling) -> optim_step
-> save_weights_and_get_sampling_client, after a short supervised warm start through the same SDK."""

import numpy as np
from tinker import types

from megatron_rl.envs.arithmetic import ArithmeticConfig
from megatron_rl.envs.single_answer import score_answer

PROBLEMS = [(a, b) for a in range(4) for b in range(4)]
ADAM = types.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8)
SCORE = ArithmeticConfig(format_reward=0.0, closeness_reward=0.0)  # 1 for the right answer, else 0
SAMPLES = 8


def _sft_datum(prompt: list[int], reply: list[int]) -> types.Datum:
    ids = prompt + reply
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(reply)})


def _rl_datum(prompt: list[int], seq, advantage: float) -> types.Datum:
    ids, k = prompt + list(seq.tokens), len(prompt) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
        "target_tokens": ids[1:], "logprobs": [0.0] * k + list(seq.logprobs),
        "advantages": [0.0] * k + [advantage] * len(seq.tokens)})


def _rewards(tok, sampler, prompts, params: types.SamplingParams, n: int):
    futures = {p: sampler.sample(types.ModelInput.from_ints(prompts[p]), num_samples=n, sampling_params=params)
               for p in PROBLEMS}
    out = {}
    for p, f in futures.items():
        seqs = f.result().sequences
        out[p] = (seqs, np.array([score_answer(tok.decode(s.tokens, skip_special_tokens=True), str(sum(p)), SCORE)[0]
                                  for s in seqs]))
    return out


def _greedy_accuracy(tok, trainer, prompts) -> float:
    sampler = trainer.save_weights_and_get_sampling_client().result()
    greedy = types.SamplingParams(max_tokens=8, temperature=0.0)
    return float(np.mean([r.mean() for _, r in _rewards(tok, sampler, prompts, greedy, 1).values()]))


def test_rl_loop_through_the_sdk_raises_the_reward(trainer):
    tok = trainer.get_tokenizer()
    prompts = {p: tok.encode(f"What is {p[0]} + {p[1]}?\n") for p in PROBLEMS}
    demos = [_sft_datum(prompts[p], tok.encode(f"The answer is {sum(p)}.") + [tok.eos_token_id]) for p in PROBLEMS]
    for _ in range(15):  # warm start: the format and a few facts, far from all of them
        trainer.forward_backward(demos, "cross_entropy").result()
        trainer.optim_step(ADAM).result()
    before = _greedy_accuracy(tok, trainer, prompts)
    curve = []
    for step in range(16):
        sampler = trainer.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=1000 * step)
        data, mean = [], []
        for p, (seqs, r) in _rewards(tok, sampler, prompts, params, SAMPLES).items():
            mean.append(r.mean())
            data += [_rl_datum(prompts[p], s, float(a)) for s, a in zip(seqs, r - r.mean()) if a != 0 and s.tokens]
        curve.append(float(np.mean(mean)))
        if data:
            trainer.forward_backward(data, "importance_sampling").result()
            trainer.optim_step(ADAM).result()
    after = _greedy_accuracy(tok, trainer, prompts)
    print(f"train reward by step {[round(c, 3) for c in curve]}; greedy accuracy {before:.3f} -> {after:.3f}")
    assert np.mean(curve[-4:]) > np.mean(curve[:4]) + 0.1, curve
    assert after > before, (before, after)
