"""Model provider: an HF checkpoint directory -> a megatron-core GPTModel for this rank's stage."""

from __future__ import annotations

from pathlib import Path

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from transformers import AutoConfig

from parallel.architectures import architecture_of, rope_theta, transformer_config_kwargs, vocab_size
from parallel.config import TrainerConfig
from parallel.layers.spec import build_layer_spec, norms_in_params_dtype, resolve
from parallel.weights.hf_import import load_hf_weights

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_hf_config(hf_dir: str | Path):
    """The HF config of a checkpoint directory (no hub access)."""
    return AutoConfig.from_pretrained(str(hf_dir), local_files_only=True)


def spec_preference(cfg: TrainerConfig) -> str:
    """``prefer`` for :func:`build_layer_spec` from ``trainer.use_transformer_engine`` and
    ``trainer.attention_backend``: te when asked, local when the local attention is asked, else fast."""
    if cfg.use_transformer_engine:
        return "te"
    return "local" if cfg.attention_backend == "local" else "fast"


def transformer_config(hf_config, cfg: TrainerConfig, pg_collection) -> TransformerConfig:
    """The TransformerConfig for this layout and precision."""
    p = cfg.parallel
    per_stage = hf_config.num_hidden_layers // p.pipeline_model_parallel_size
    if cfg.recompute.granularity == "full" and cfg.recompute.num_layers > per_stage:
        raise ValueError(
            f"trainer.recompute.num_layers: {cfg.recompute.num_layers} but each pipeline stage holds {per_stage} "
            f"layers; use 1..{per_stage}"
        )
    if cfg.recompute.granularity == "selective" and "layernorm" in cfg.recompute.modules and resolve(spec_preference(cfg)) != "te":
        raise ValueError(
            "trainer.recompute.modules: layernorm needs Transformer Engine (megatron-core's CheckpointWithoutOutput "
            "always takes its fp8 path, which imports TE); drop it here, or use granularity=full"
        )
    return TransformerConfig(
        **transformer_config_kwargs(hf_config, _DTYPES[cfg.dtype]),
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        expert_model_parallel_size=p.expert_model_parallel_size,
        expert_tensor_parallel_size=p.expert_tensor_parallel_size or p.tensor_model_parallel_size,
        pipeline_dtype=_DTYPES[cfg.dtype],
        use_cpu_initialization=not torch.cuda.is_available(),
        **cfg.recompute.transformer_config_kwargs(),
    )


def layer_spec(config: TransformerConfig, cfg: TrainerConfig) -> ModuleSpec:
    """The decoder layer spec (``parallel.layers.spec``); its parameters map to HF names the same way."""
    try:
        return build_layer_spec(
            config, moe=bool(config.num_moe_experts), qk_layernorm=bool(config.qk_layernorm), prefer=spec_preference(cfg)
        )
    except ValueError as e:
        raise ValueError(f"trainer.use_transformer_engine: {e}") from e


def load_model(hf_dir: str | Path, cfg: TrainerConfig, pg_collection) -> GPTModel:
    """This rank's GPTModel with the checkpoint's weights: :func:`build_model`, then
    :func:`parallel.weights.hf_import.load_hf_weights`."""
    model = build_model(hf_dir, cfg, pg_collection)
    load_hf_weights(model, hf_dir, pg_collection)
    return model


def build_model(hf_dir: str | Path, cfg: TrainerConfig, pg_collection) -> GPTModel:
    """This rank's GPTModel (its pipeline stage, TP shard and local experts), randomly initialised
    (:func:`load_model` loads the checkpoint's weights into it)."""
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
    norms_in_params_dtype(model, config.params_dtype)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model
