"""Tiny GPT models on megatron-core over gloo, built from a chosen layer spec, for parity checks.

``spawn(fn, world, tp=, ep=)`` runs ``fn(rank)`` in ``world`` CPU processes with megatron's model
parallel state initialised; an exception in any rank fails the caller.
"""

from __future__ import annotations

import socket

import torch
import torch.multiprocessing as mp

VOCAB = 128
SEQ = 16


def spawn(fn, world: int, *, tp: int = 1, ep: int = 1) -> None:
    port = _free_port()
    mp.spawn(_worker, args=(fn, world, tp, ep, port), nprocs=world, join=True)


def _worker(rank, fn, world, tp, ep, port):
    from parallel.config import ParallelConfig
    from parallel.groups import destroy_distributed, init_distributed

    torch.set_num_threads(1)
    layout = ParallelConfig(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    init_distributed(layout, rank, world, f"tcp://127.0.0.1:{port}")
    try:
        fn(rank)
    finally:
        destroy_distributed()


def tiny_config(*, moe: bool, tp: int = 1, ep: int = 1, qk_layernorm: bool = True):
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra = {}
    if moe:
        extra = dict(
            num_moe_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=32,
            # alltoall needs split sizes as Python ints on gloo (not yet in parallel.cpu_compat).
            moe_token_dispatcher_type="allgather",
            moe_router_load_balancing_type="none",
            expert_model_parallel_size=ep,
        )
    return TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=96,
        kv_channels=16,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        normalization="RMSNorm",
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        params_dtype=torch.float32,
        qk_layernorm=qk_layernorm,
        **extra,
    )


def build_pair(*, moe: bool, tp: int = 1, ep: int = 1, qk_layernorm: bool = True):
    """(local-spec model, fast-spec model) with identical weights."""
    from parallel.layers.spec import build_layer_spec

    models = []
    for prefer in ("local", "fast"):
        config = tiny_config(moe=moe, tp=tp, ep=ep, qk_layernorm=qk_layernorm)
        spec = build_layer_spec(config, moe=moe, qk_layernorm=qk_layernorm, prefer=prefer)
        models.append(_gpt(config, spec))
    models[1].load_state_dict(models[0].state_dict())
    return models


def _gpt(config, spec):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=64,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )


def logprobs(model, inputs, labels, *, attention_mask=None, position_ids=None, packed_seq_params=None):
    """Log-probability of each label token [b, s], computed vocab-parallel by megatron."""
    if position_ids is None:
        position_ids = torch.arange(inputs.shape[1]).expand_as(inputs)
    loss = model(inputs, position_ids, attention_mask, labels=labels, packed_seq_params=packed_seq_params)
    return -loss


def causal_mask(seq: int) -> torch.Tensor:
    """Megatron's convention: True where attention is masked out, [1, 1, s, s]."""
    return torch.ones(seq, seq, dtype=torch.bool).triu(1)[None, None]


def grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
