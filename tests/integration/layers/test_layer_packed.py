"""Packed rows (several trajectories in one row, ``thd``) give the same per-token log-probs as the
same trajectories right-padded one per row, through the fast spec, and as megatron's local spec."""

from __future__ import annotations

import torch

from tests.integration.layers.harness import VOCAB, build_pair, causal_mask, logprobs, spawn

LENGTHS = (9, 17, 5)


def _check_packed(rank: int, *, moe: bool) -> None:
    from megatron.core.packed_seq_params import PackedSeqParams

    local, fast = build_pair(moe=moe)
    torch.manual_seed(7)
    docs = [torch.randint(0, VOCAB, (n + 1,)) for n in LENGTHS]
    longest = max(LENGTHS)
    inputs = torch.zeros(len(docs), longest, dtype=torch.long)
    labels = torch.zeros_like(inputs)
    for row, doc in enumerate(docs):
        inputs[row, : len(doc) - 1], labels[row, : len(doc) - 1] = doc[:-1], doc[1:]
    padded = logprobs(local, inputs, labels, attention_mask=causal_mask(longest))

    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    params = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest
    )
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    packed_inputs = torch.cat([doc[:-1] for doc in docs])[None]
    packed_labels = torch.cat([doc[1:] for doc in docs])[None]
    packed = logprobs(fast, packed_inputs, packed_labels, position_ids=positions, packed_seq_params=params)

    expected = torch.cat([padded[row, :n] for row, n in enumerate(LENGTHS)])
    torch.testing.assert_close(packed[0], expected, rtol=0, atol=1e-5)


def _dense(rank):
    _check_packed(rank, moe=False)


def _moe(rank):
    _check_packed(rank, moe=True)


def test_packed_matches_padded_dense():
    spawn(_dense, 1)


def test_packed_matches_padded_moe():
    spawn(_moe, 1)
