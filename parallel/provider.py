"""Model provider: an HF checkpoint directory -> a megatron-core GPTModel for this rank's stage."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt import gpt_layer_specs
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from transformers import AutoConfig

from parallel.architectures import architecture_of, rope_theta, transformer_config_kwargs, vocab_size
from parallel.attention import SDPAttention
from parallel.config import TrainerConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_hf_config(hf_dir: str | Path):
    """The HF config of a checkpoint directory (no hub access)."""
    return AutoConfig.from_pretrained(str(hf_dir), local_files_only=True)


def use_transformer_engine(cfg: TrainerConfig) -> bool:
    """True for the TE spec: when asked, or when unset and TE imports."""
    available = importlib.util.find_spec("transformer_engine") is not None
    if cfg.use_transformer_engine and not available:
        raise ValueError("trainer.use_transformer_engine=true but transformer_engine is not installed")
    return available if cfg.use_transformer_engine is None else cfg.use_transformer_engine


def transformer_config(hf_config, cfg: TrainerConfig, pg_collection) -> TransformerConfig:
    """The TransformerConfig for this layout and precision."""
    p = cfg.parallel
    return TransformerConfig(
        **transformer_config_kwargs(hf_config, _DTYPES[cfg.dtype]),
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        expert_model_parallel_size=p.expert_model_parallel_size,
        expert_tensor_parallel_size=p.expert_tensor_parallel_size or p.tensor_model_parallel_size,
        pipeline_dtype=_DTYPES[cfg.dtype],
        use_cpu_initialization=not torch.cuda.is_available(),
    )


def layer_spec(config: TransformerConfig, cfg: TrainerConfig) -> ModuleSpec:
    """TE spec when TE is used, else the local spec (with SDPA core attention unless told otherwise)."""
    experts = config.num_moe_experts
    if use_transformer_engine(cfg):
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=experts, qk_layernorm=config.qk_layernorm
        )
    spec = gpt_layer_specs.get_gpt_layer_local_spec(
        num_experts=experts, qk_layernorm=config.qk_layernorm, normalization="RMSNorm"
    )
    if cfg.attention_backend == "sdpa":
        attn = spec.submodules.self_attention
        attn_sub = dataclasses.replace(attn.submodules, core_attention=ModuleSpec(module=SDPAttention))
        spec.submodules.self_attention = dataclasses.replace(attn, submodules=attn_sub)
    return spec


def build_model(hf_dir: str | Path, cfg: TrainerConfig, pg_collection) -> GPTModel:
    """This rank's GPTModel (its pipeline stage, TP shard and local experts), randomly initialised.

    Load weights with :func:`parallel.weights.hf_import.load_hf_weights`.
    """
    hf_config = load_hf_config(hf_dir)
    architecture_of(hf_config)
    config = transformer_config(hf_config, cfg, pg_collection)
    tp = cfg.parallel.tensor_model_parallel_size
    if vocab_size(hf_config) % tp:
        raise ValueError(
            f"trainer.parallel.tensor_model_parallel_size: vocabulary {vocab_size(hf_config)} is not divisible by {tp}"
        )
    pp_rank, pp_size = pg_collection.pp.rank(), pg_collection.pp.size()
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(config, cfg),
        vocab_size=vocab_size(hf_config),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pp_rank == 0,
        post_process=pp_rank == pp_size - 1,
        parallel_output=True,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
        pg_collection=pg_collection,
    )
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model
