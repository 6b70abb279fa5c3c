"""Which GPT layer spec the model provider gets: Transformer Engine, the fast local modules, or
megatron-core's plain local spec.

``auto`` takes TE when ``transformer_engine`` imports, else ``fast``: megatron's local spec with
core attention swapped for :class:`SDPAttention` and ``SequentialMLP`` for
:class:`GroupedSequentialMLP` (same parameters). ``local`` (megatron's own, unfused) only on request.
"""

from __future__ import annotations

import importlib.util
import logging
from functools import partial

import torch

from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from parallel.layers.attention import SDPAttention
from parallel.layers.experts import GroupedSequentialMLP

log = logging.getLogger(__name__)

CHOICES = ("auto", "te", "fast", "local")


def build_layer_spec(config: TransformerConfig, *, moe: bool, qk_layernorm: bool, prefer: str = "auto") -> ModuleSpec:
    """The GPT decoder layer spec for ``config``; logs which implementation was chosen and why."""
    if prefer not in CHOICES:
        raise ValueError(f"layer spec prefer={prefer!r} is not one of {CHOICES}")
    if moe and not config.num_moe_experts:
        raise ValueError("moe=True needs config.num_moe_experts > 0")
    if qk_layernorm != bool(config.qk_layernorm):
        raise ValueError(f"qk_layernorm={qk_layernorm} but config.qk_layernorm={config.qk_layernorm}: set both the same")
    choice = resolve(prefer)
    num_experts = config.num_moe_experts if moe else None
    if choice == "te":
        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=config.moe_grouped_gemm, qk_layernorm=qk_layernorm
        )
    else:
        spec = get_gpt_layer_local_spec(
            num_experts=num_experts, qk_layernorm=qk_layernorm, normalization=config.normalization
        )
        if choice == "fast":
            _swap_in_fast_modules(spec, moe)
    log.info("layer spec: %s (asked %s; %s)", choice, prefer, "MoE" if moe else "dense")
    return spec


def norms_in_params_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast the torch norms of the local and fast specs to the model's ``params_dtype``.

    Without TE, megatron-core builds ``torch.nn.RMSNorm``/``LayerNorm`` with float32 weights and relies
    on its ``Float16Module`` wrapper to cast the model, which this toolkit does not use. In a bf16 model
    float32 norms mix dtypes in every norm (casts, and torch's unfused norm path) and hold weights
    the bf16 checkpoint and vLLM do not have. The optimizer keeps float32 main copies, as for every
    other bf16 parameter. Call before wrapping the model in DDP.
    """
    for module in model.modules():
        if isinstance(module, (torch.nn.RMSNorm, torch.nn.LayerNorm)):
            module.to(dtype)


def resolve(prefer: str) -> str:
    """``te``, ``fast`` or ``local`` for a ``prefer`` value; ``te`` only when TE imports."""
    has_te = importlib.util.find_spec("transformer_engine") is not None and _te_imports()
    if prefer == "te" and not has_te:
        raise ValueError("prefer='te' but transformer_engine does not import here: use 'auto' or 'fast'")
    if prefer == "auto":
        return "te" if has_te else "fast"
    return prefer


def _te_imports() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # a broken TE install (CUDA mismatch) raises more than ImportError
        return False
    return True


def _swap_in_fast_modules(spec: ModuleSpec, moe: bool) -> None:
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    if not moe:
        return
    moe_submodules = spec.submodules.mlp.keywords["submodules"]
    experts = moe_submodules.experts
    assert experts.func is SequentialMLP, f"unexpected local experts builder {experts}"
    moe_submodules.experts = partial(GroupedSequentialMLP, *experts.args, **experts.keywords)
