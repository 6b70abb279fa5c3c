"""Tinker datums to a TrainingBatch, checked field by field; the answer rows back to per-datum arrays.

A datum's ``model_input`` (n tokens) and ``loss_fn_inputs.target_tokens`` (n tokens) are the usual
shifted pair: the row is ``model_input + [target_tokens[-1]]`` and position p (1..n) carries the
inputs of target p-1, where the trainer computes log p(row[p] | row[:p]).
"""

from __future__ import annotations

import numpy as np
import torch

from megatron_rl.contracts import TrainingBatch
from megatron_rl.tinker.losses import TINKER_LOSSES
from megatron_rl.tinker.wire import DatumIn

_NEEDS = {"cross_entropy": ("target_tokens",), "importance_sampling": ("target_tokens", "logprobs", "advantages"),
          "ppo": ("target_tokens", "logprobs", "advantages")}
_REGISTERED_NEEDS = ("target_tokens", "logprobs", "advantages")
_KNOWN = {"target_tokens", "weights", "logprobs", "advantages", "mask", "old_logprobs"}


def _field(d: DatumIn, i: int, name: str, n: int) -> np.ndarray:
    x = np.asarray(d.inputs[name]).reshape(-1)
    if x.shape[0] != n:
        raise ValueError(f"data[{i}].loss_fn_inputs.{name}: has {x.shape[0]} values, model_input has {n} tokens")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise ValueError(f"data[{i}].loss_fn_inputs.{name}: holds a non-finite value")
    return x


def to_batch(data: list[DatumIn], loss_fn: str, vocab_size: int, max_len: int, pad_id: int) -> TrainingBatch:
    if not data:
        raise ValueError("data: empty; send at least one datum")
    needs = _NEEDS.get(loss_fn, _REGISTERED_NEEDS)
    rows = []
    for i, d in enumerate(data):
        n = len(d.tokens)
        if n < 1:
            raise ValueError(f"data[{i}].model_input: empty")
        if n + 1 > max_len:
            raise ValueError(f"data[{i}].model_input: {n} tokens; this service trains rows of at most {max_len - 1}")
        missing = [k for k in needs if k not in d.inputs]
        if missing:
            raise ValueError(f"data[{i}].loss_fn_inputs.{missing[0]}: required by loss_fn={loss_fn}")
        unknown = sorted(set(d.inputs) - _KNOWN)
        if unknown:
            raise ValueError(f"data[{i}].loss_fn_inputs.{unknown[0]}: unknown input (known: {sorted(_KNOWN)})")
        target = _field(d, i, "target_tokens", n).astype(np.int64)
        if n > 1 and not np.array_equal(target[:-1], np.asarray(d.tokens[1:])):
            raise ValueError(f"data[{i}].loss_fn_inputs.target_tokens: must be model_input shifted by one token "
                             "(target_tokens[t] == model_input[t + 1]); this service trains next-token targets only")
        ids = list(d.tokens) + [int(target[-1])]
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ValueError(f"data[{i}]: token id outside the vocabulary [0, {vocab_size})")
        get = lambda k, default: _field(d, i, k, n).astype(np.float32) if k in d.inputs else default  # noqa: E731
        if loss_fn == "cross_entropy":
            adv = get("weights", np.ones(n, np.float32))
            mask = np.ones(n, np.float32)
        else:
            adv = get("advantages", None)
            default_mask = np.ones(n, np.float32) if loss_fn in TINKER_LOSSES else (adv != 0).astype(np.float32)
            mask = get("mask", default_mask)
            if not np.isin(mask, (0.0, 1.0)).all():
                raise ValueError(f"data[{i}].loss_fn_inputs.mask: must hold only 0/1")
        rows.append((ids, adv, mask, get("logprobs", np.zeros(n, np.float32)), get("old_logprobs", None)))
    return _collate(rows, pad_id)


def _collate(rows, pad_id: int) -> TrainingBatch:
    width = max(len(r[0]) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn, mask, adv, logp = (torch.zeros(b, width) for _ in range(4))
    with_old = any(r[4] is not None for r in rows)
    old = torch.zeros(b, width) if with_old else None
    for k, (toks, a, m, lp, o) in enumerate(rows):
        n = len(toks)
        ids[k, :n] = torch.tensor(toks)
        attn[k, :n] = 1
        mask[k, 1:n] = torch.from_numpy(m)
        adv[k, 1:n] = torch.from_numpy(a)
        logp[k, 1:n] = torch.from_numpy(lp)
        if with_old:
            if o is None:
                raise ValueError(f"data[{k}].loss_fn_inputs.old_logprobs: given for some datums but not this one")
            old[k, 1:n] = torch.from_numpy(o)
    return TrainingBatch(ids, attn, mask, adv, logp, torch.arange(b), [f"datum-{k}" for k in range(b)],
                         torch.ones(b, dtype=torch.long), old_logprobs=old)


def per_datum(batch: TrainingBatch, logp: torch.Tensor, token_loss: torch.Tensor) -> list[dict[str, np.ndarray]]:
    out = []
    for k in range(batch.num_rows):
        n = int(batch.attention_mask[k].sum())
        out.append({"logprobs": logp[k, 1:n].numpy().astype(np.float32),
                    "elementwise_loss": token_loss[k, 1:n].numpy().astype(np.float32)})
    return out
