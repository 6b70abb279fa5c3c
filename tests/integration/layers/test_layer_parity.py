"""The fast layer spec against megatron's local spec on CPU (float32), over gloo with 2 ranks:
same log-probs within 1e-5 and same gradients, dense under TP=2 and MoE under EP=2."""

from __future__ import annotations

import torch

from tests.integration.layers.harness import VOCAB, build_pair, causal_mask, grads, logprobs, spawn

BATCH, SEQ = 2, 24


def _check_parity(rank: int, *, moe: bool, tp: int = 1, ep: int = 1) -> None:
    local, fast = build_pair(moe=moe, tp=tp, ep=ep)
    torch.manual_seed(100 + rank if ep > 1 else 100)  # EP ranks see different tokens, TP ranks the same
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    weights = torch.randn(BATCH, SEQ)
    # megatron's local attention needs an explicit mask; the fast one takes None and runs is_causal.
    expected = logprobs(local, inputs, labels, attention_mask=causal_mask(SEQ))
    got = logprobs(fast, inputs, labels)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    with torch.no_grad():  # the explicit-mask path (SDPA attn_mask) agrees too
        masked = logprobs(fast, inputs, labels, attention_mask=causal_mask(SEQ))
    torch.testing.assert_close(masked, expected.detach(), rtol=0, atol=1e-5)
    (expected * weights).sum().backward()
    (got * weights).sum().backward()
    want, have = grads(local), grads(fast)
    assert want.keys() == have.keys() and want
    for name in want:
        torch.testing.assert_close(have[name], want[name], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    if moe:
        assert any("local_experts.1.linear_fc1.weight" in name for name in have), "expected 2 local experts"


def _dense_tp2(rank):
    _check_parity(rank, moe=False, tp=2)


def _moe_ep2(rank):
    _check_parity(rank, moe=True, ep=2)


def test_dense_tp2_matches_local_spec():
    spawn(_dense_tp2, 2, tp=2)


def test_moe_ep2_matches_local_spec():
    spawn(_moe_ep2, 2, ep=2)
