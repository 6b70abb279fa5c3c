"""Every HF tensor of a model (name, shape) from its ``config.json`` alone, without weights: what ``plan`` sizes
memory and transfers from for models that cannot be loaded here (Qwen3-8B, Qwen3-30B-A3B, Qwen3-235B-A22B).

Registered by exact HF architecture name; the tensor names are those of the HF checkpoints (and of vLLM's loader).
"""

from __future__ import annotations

import json
from pathlib import Path

from weight_transfer.plan import TensorSpec

_FAMILIES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
             "LlamaForCausalLM": "llama"}


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"model.path: no config.json in {model_dir}")
    return json.loads(path.read_text())


def num_experts(config: dict) -> int:
    """Routed experts per MoE layer (published Qwen3-MoE configs say ``num_experts``, transformers 5 writes
    ``num_local_experts``); 0 for a dense model."""
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def family(config: dict) -> str:
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in _FAMILIES:
        raise ValueError(f"model config: architecture {arch!r} has no shape rule; known: {sorted(_FAMILIES)}")
    return _FAMILIES[arch]


def _attention(prefix: str, c: dict, fam: str) -> list[tuple[str, tuple[int, ...]]]:
    hidden, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    out = [(f"{prefix}.q_proj.weight", (heads * head_dim, hidden)), (f"{prefix}.k_proj.weight", (kv * head_dim, hidden)),
           (f"{prefix}.v_proj.weight", (kv * head_dim, hidden)), (f"{prefix}.o_proj.weight", (hidden, heads * head_dim))]
    if fam == "qwen2" or c.get("attention_bias"):
        out += [(f"{prefix}.q_proj.bias", (heads * head_dim,)), (f"{prefix}.k_proj.bias", (kv * head_dim,)),
                (f"{prefix}.v_proj.bias", (kv * head_dim,))]
    if fam in ("qwen3", "qwen3_moe"):
        out += [(f"{prefix}.q_norm.weight", (head_dim,)), (f"{prefix}.k_norm.weight", (head_dim,))]
    return out


def _mlp(prefix: str, hidden: int, inter: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}.gate_proj.weight", (inter, hidden)), (f"{prefix}.up_proj.weight", (inter, hidden)),
            (f"{prefix}.down_proj.weight", (hidden, inter))]


def _is_moe_layer(c: dict, layer: int) -> bool:
    step = c.get("decoder_sparse_step") or 1
    return num_experts(c) > 0 and layer not in (c.get("mlp_only_layers") or []) and (layer + 1) % step == 0


def hf_tensor_specs(config: dict, dtype: str) -> list[TensorSpec]:
    """Name and shape of every tensor of the HF checkpoint ``config`` describes, in ``dtype``."""
    fam, c = family(config), config
    hidden, vocab = c["hidden_size"], c["vocab_size"]
    shapes = [("model.embed_tokens.weight", (vocab, hidden)), ("model.norm.weight", (hidden,))]
    if not c.get("tie_word_embeddings"):
        shapes.append(("lm_head.weight", (vocab, hidden)))
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        shapes += [(f"{p}.input_layernorm.weight", (hidden,)), (f"{p}.post_attention_layernorm.weight", (hidden,))]
        shapes += _attention(f"{p}.self_attn", c, fam)
        if _is_moe_layer(c, layer):
            shapes.append((f"{p}.mlp.gate.weight", (num_experts(c), hidden)))
            for e in range(num_experts(c)):
                shapes += _mlp(f"{p}.mlp.experts.{e}", hidden, c["moe_intermediate_size"])
        else:
            shapes += _mlp(f"{p}.mlp", hidden, c["intermediate_size"])
    return [TensorSpec(name, shape, dtype) for name, shape in shapes]
