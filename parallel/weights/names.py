"""Megatron parameter names (global layer and expert numbers) <-> HF names, per supported family.

A megatron name maps to one or more HF tensors and a kind that says how they combine:
``plain`` (one tensor, the same values), ``qkv`` (q/k/v fused by KV group) or ``gate_up`` (gate and
up fused per tensor-parallel shard). The local spec keeps layer norms as modules; the TE spec fuses
them into the following linear as ``layer_norm_weight``; both spellings are here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class HFSource:
    """The HF tensors one megatron parameter is made of."""

    kind: str
    """plain, qkv or gate_up."""
    hf_names: tuple[str, ...]
    """In order: (name,), (q, k, v) or (gate, up)."""


_TOP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}

_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
}

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT_RE = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")


def hf_source(name: str) -> HFSource:
    """The HF tensors of the megatron parameter ``name`` (global layer and expert numbers)."""
    if name in _TOP:
        return HFSource("plain", (_TOP[name],))
    m = _LAYER_RE.match(name)
    if not m:
        raise KeyError(f"no HF mapping for megatron parameter {name!r}")
    prefix, rest = f"model.layers.{m.group(1)}.", m.group(2)
    if rest in _LAYER:
        return HFSource("plain", (prefix + _LAYER[rest],))
    if rest.startswith("self_attention.linear_qkv.") and rest.rsplit(".", 1)[1] in ("weight", "bias"):
        suffix = rest.rsplit(".", 1)[1]
        return HFSource("qkv", tuple(f"{prefix}self_attn.{p}_proj.{suffix}" for p in "qkv"))
    if rest == "mlp.linear_fc1.weight":
        return HFSource("gate_up", (prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"))
    e = _EXPERT_RE.match(rest)
    if e:
        expert = f"{prefix}mlp.experts.{e.group(1)}."
        if e.group(2) == "linear_fc1":
            return HFSource("gate_up", (expert + "gate_proj.weight", expert + "up_proj.weight"))
        return HFSource("plain", (expert + "down_proj.weight",))
    raise KeyError(f"no HF mapping for megatron parameter {name!r}")
