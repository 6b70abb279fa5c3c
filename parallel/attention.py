"""Core attention for the local layer spec through ``torch.nn.functional.scaled_dot_product_attention``.

megatron-core's local ``DotProductAttention`` materialises the ``[b, heads, s, s]`` score matrix; on
the H200 at sequence 4096 that costs 3x the time and memory of SDPA's fused kernels (PLATFORM.md).
Rows are right-padded, so a causal mask is exact for every real token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide


class SDPAttention(MegatronModule):
    """Causal grouped-query attention; same call signature as megatron's ``DotProductAttention``."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, pg_collection=None, **_):
        super().__init__(config=config)
        tp = pg_collection.tp.size() if pg_collection is not None else 1
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups, tp)
        self.scale = 1.0 / math.sqrt(config.kv_channels)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None):
        """``query [s, b, heads, d]``, ``key``/``value [s, b, groups, d]`` -> ``[s, b, heads * d]``."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("trainer.attention_backend=sdpa: packed sequences and attention bias need the TE spec")
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=self.groups != self.heads
        )
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)
