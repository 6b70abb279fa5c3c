"""Core attention on torch's fused kernels: a drop-in for megatron-core's ``DotProductAttention``.

Megatron's local ``DotProductAttention`` builds the [b, heads, s, s] score matrix and softmaxes it
in Python; at sequence 4096 that tripled step time and memory on the H200. ``SDPAttention`` takes
the same constructor and ``forward`` arguments and the same ``sbhd`` tensors, and computes:

- padded batches (``sbhd``): ``scaled_dot_product_attention`` (flash / memory-efficient kernels),
  ``is_causal`` when no mask is passed and the mask type is causal, GQA without repeating K/V;
  an explicit boolean ``attention_mask`` (True = masked out, megatron's convention) is honoured.
  Pass ``attention_mask=None`` for the fastest path: causal masking alone is exact for
  right-padded rows, since no real token attends to a later pad;
- packed sequences (``packed_seq_params.qkv_format == "thd"``): document-causal attention through
  the best kernel of :mod:`parallel.layers.packed` (flash varlen, compiled FlexAttention, or a
  per-document SDPA loop on CPU); the t×t score matrix is never built.

Tensor parallelism splits heads before this module, which only sees its partition's heads.
Context parallelism is not supported (megatron's local attention refuses it too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.utils import is_layer_window_attention

from parallel.layers.packed import select_packed_kernel


class SDPAttention(DotProductAttention):
    """``DotProductAttention`` with the same interface, computed by fused torch kernels."""

    def __init__(
        self,
        config,
        layer_number,
        attn_mask_type,
        attention_type,
        attention_dropout=None,
        softmax_scale=None,
        cp_comm_type=None,
        pg_collection=None,
    ):
        _check_supported(config, layer_number)
        super().__init__(
            config,
            layer_number,
            attn_mask_type,
            attention_type,
            attention_dropout=attention_dropout,
            softmax_scale=softmax_scale,
            cp_comm_type=cp_comm_type,
            pg_collection=pg_collection,
        )
        # The parent divides the scale by the layer number when apply_query_key_layer_scaling is on
        # and multiplies it back inside its softmax; the kernels take the net scale.
        coeff = self.layer_number if config.apply_query_key_layer_scaling else 1
        self.scale = self.softmax_scale * coeff

    def forward(
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        """query [s, b, hq, d], key/value [s, b, hkv, d] (or [t, h, d] packed) -> [s, b, hq*d]."""
        if attention_bias is not None:
            raise ValueError("attention_bias is not supported by SDPAttention: use the TE layer spec")
        dropout = self.attention_dropout.p if self.training else 0.0
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            if dropout:
                raise ValueError("attention dropout is not supported with packed sequences: set attention_dropout=0")
            return self._packed(query, key, value, packed_seq_params)
        if dropout and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return self._padded(query, key, value, attention_mask, attn_mask_type, dropout)
        return self._padded(query, key, value, attention_mask, attn_mask_type, dropout)

    def _padded(self, query, key, value, attention_mask, attn_mask_type, dropout):
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            raise ValueError(f"attention_mask must be boolean (True = masked out), got {attention_mask.dtype}")
        seq, batch = query.shape[:2]
        out = F.scaled_dot_product_attention(
            query.permute(1, 2, 0, 3),
            key.permute(1, 2, 0, 3),
            value.permute(1, 2, 0, 3),
            attn_mask=None if attention_mask is None else ~attention_mask,
            dropout_p=dropout,
            is_causal=attention_mask is None and mask_type == AttnMaskType.causal,
            scale=self.scale,
            enable_gqa=query.shape[2] != key.shape[2],
        )
        return out.permute(2, 0, 1, 3).reshape(seq, batch, -1)

    def _packed(self, query, key, value, params):
        # Self-attention: the key boundaries are the query boundaries.
        cu_q = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
        _, kernel = select_packed_kernel(query.device)
        out = kernel(query, key, value, cu_q, self.scale)
        return out.reshape(out.shape[0], -1)


def _check_supported(config, layer_number: int) -> None:
    """Features of megatron's local attention this module does not reproduce, with the way out."""
    if config.context_parallel_size != 1:
        raise ValueError(
            f"context_parallel_size={config.context_parallel_size} needs Transformer Engine attention "
            "(prefer='te'); SDPAttention, like megatron's local attention, runs only without CP"
        )
    if config.softmax_type != "vanilla":
        raise ValueError(f"softmax_type={config.softmax_type!r} is not supported by SDPAttention: use prefer='local'")
    if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
        raise ValueError("sliding-window attention is not supported by SDPAttention: use prefer='local'")
