"""Per-token log-probabilities and entropy from vocabulary-parallel logits.

Each tensor-parallel rank holds logits for its slice of the vocabulary only. The softmax
normaliser, the target logit and the entropy term are reduced over the TP group as scalars per
token, so no rank ever holds full-vocabulary logits. Gradients flow to every rank's slice
(megatron's reduce: all-reduce forward, identity backward).
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region


def _all_max(x: torch.Tensor, group) -> torch.Tensor:
    if group.size() > 1:
        torch.distributed.all_reduce(x, op=torch.distributed.ReduceOp.MAX, group=group)
    return x


def vocab_parallel_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, tp_group, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits [..., V/tp]`` (this rank's vocab slice), ``targets [...]`` global ids -> (log p, entropy).

    Computed in float32 whatever the logits dtype.
    """
    logits = logits.float()
    reduce = lambda x: reduce_from_tensor_model_parallel_region(x, group=tp_group)  # noqa: E731
    width = logits.shape[-1]
    start = tp_group.rank() * width
    shifted = logits - _all_max(logits.detach().amax(dim=-1, keepdim=True), tp_group)
    exp = shifted.exp()
    log_z = reduce(exp.sum(dim=-1)).log()
    local = targets - start
    here = (local >= 0) & (local < width)
    picked = shifted.gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
    logp = reduce(torch.where(here, picked, torch.zeros_like(picked))) - log_z
    if not with_entropy:
        return logp, None
    # H = log Z - E_p[shifted] with p = exp / Z.
    mean_shifted = reduce((exp * shifted).sum(dim=-1)) / log_z.exp()
    return logp, log_z - mean_shifted
