"""HF architecture name -> megatron-core TransformerConfig: an exact-name registry, no substring matching."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Architecture:
    """What distinguishes one supported HF decoder family from the others on the Megatron side."""

    qkv_bias: bool
    """Attention q/k/v projections carry a bias (Qwen2)."""
    qk_layernorm: bool
    """RMSNorm on each head's query and key (Qwen3)."""
    moe: bool
    """MLP is a top-k routed mixture of experts (Qwen3-MoE)."""


ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture(qkv_bias=False, qk_layernorm=False, moe=False),
    "Qwen2ForCausalLM": Architecture(qkv_bias=True, qk_layernorm=False, moe=False),
    "Qwen3ForCausalLM": Architecture(qkv_bias=False, qk_layernorm=True, moe=False),
    "Qwen3MoeForCausalLM": Architecture(qkv_bias=False, qk_layernorm=True, moe=True),
}


def architecture_of(hf_config) -> tuple[str, Architecture]:
    """The registry entry for ``hf_config.architectures[0]``; ValueError listing the supported ones."""
    names = list(getattr(hf_config, "architectures", None) or [])
    if len(names) != 1 or names[0] not in ARCHITECTURES:
        raise ValueError(
            f"model: unsupported architecture {names or 'none'} in the HF config; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    return names[0], ARCHITECTURES[names[0]]


def head_dim(hf_config) -> int:
    """Per-head width (explicit in Qwen3/Llama configs, implied in Qwen2)."""
    explicit = getattr(hf_config, "head_dim", None)
    return int(explicit) if explicit else hf_config.hidden_size // hf_config.num_attention_heads


def _check_supported(hf_config, arch: Architecture) -> None:
    scaling = getattr(hf_config, "rope_scaling", None)
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type not in (None, "default"):
        raise ValueError(f"model: rope scaling {rope_type!r} is not supported yet; only default RoPE")
    if getattr(hf_config, "tie_word_embeddings", False):
        raise ValueError("model: tied input/output embeddings are not supported yet (tie_word_embeddings=true)")
    if arch.moe:
        if getattr(hf_config, "mlp_only_layers", None) or getattr(hf_config, "decoder_sparse_step", 1) != 1:
            raise ValueError("model: Qwen3-MoE with dense layers (mlp_only_layers, decoder_sparse_step) is not supported")
        if getattr(hf_config, "shared_expert_intermediate_size", 0):
            raise ValueError("model: shared experts are not supported yet")


def rope_theta(hf_config) -> float:
    """RoPE base (transformers 5 keeps it in ``rope_parameters``)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def transformer_config_kwargs(hf_config, dtype: torch.dtype) -> dict[str, Any]:
    """TransformerConfig fields that reproduce the HF model's forward exactly."""
    _, arch = architecture_of(hf_config)
    _check_supported(hf_config, arch)
    kwargs: dict[str, Any] = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim(hf_config),
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        attention_softmax_in_fp32=True,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        # Rows differ in length between micro-batches; pipeline stages exchange shapes. (megatron
        # rejects that with the default allgather dispatcher even for dense models.)
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",
    )
    if arch.moe:
        kwargs.update(
            num_moe_experts=hf_config.num_experts,
            moe_router_topk=hf_config.num_experts_per_tok,
            moe_ffn_hidden_size=hf_config.moe_intermediate_size,
            # HF softmaxes over all experts then renormalises the top-k when norm_topk_prob; that
            # equals a softmax over the top-k logits (megatron's default, pre_softmax=False).
            moe_router_pre_softmax=not hf_config.norm_topk_prob,
            moe_router_score_function="softmax",
            moe_router_dtype="fp32",
            moe_router_load_balancing_type="none",
            moe_aux_loss_coeff=0.0,
            moe_grouped_gemm=False,
            moe_permute_fusion=False,
            moe_enable_routing_replay=True,
        )
    return kwargs


def vocab_size(hf_config) -> int:
    """Rows of the embedding and output matrices."""
    return int(hf_config.vocab_size)
