"""build_layer_spec: which modules each choice puts in the layer, the log line, and user errors.

Runs in a spawned process: megatron-core on CPU needs parallel.cpu_compat, which patches torch.cuda
for the whole process."""

from __future__ import annotations

import logging

import pytest

from tests.integration.layers.harness import spawn, tiny_config


def _checks(rank):
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.moe.experts import SequentialMLP

    from parallel.layers.attention import SDPAttention
    from parallel.layers.experts import GroupedSequentialMLP
    from parallel.layers.spec import build_layer_spec

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("parallel.layers.spec").addHandler(handler)
    logging.getLogger("parallel.layers.spec").setLevel(logging.INFO)

    config = tiny_config(moe=True)
    for prefer, attention, experts in (("auto", SDPAttention, GroupedSequentialMLP), ("local", DotProductAttention, SequentialMLP)):
        spec = build_layer_spec(config, moe=True, qk_layernorm=True, prefer=prefer)
        assert spec.submodules.self_attention.submodules.core_attention is attention
        assert spec.submodules.mlp.keywords["submodules"].experts.func is experts
    assert [r.getMessage() for r in records] == ["layer spec: fast (asked auto; MoE)", "layer spec: local (asked local; MoE)"]

    dense = build_layer_spec(tiny_config(moe=False), moe=False, qk_layernorm=True)
    assert dense.submodules.self_attention.submodules.core_attention is SDPAttention

    for kwargs, message in (
        (dict(prefer="te"), "transformer_engine does not import"),
        (dict(prefer="fused"), "not one of"),
        (dict(qk_layernorm=False), "config.qk_layernorm"),
    ):
        with pytest.raises(ValueError, match=message):
            build_layer_spec(config, **{"moe": True, "qk_layernorm": True, **kwargs})
    with pytest.raises(ValueError, match="num_moe_experts"):
        build_layer_spec(tiny_config(moe=False), moe=True, qk_layernorm=True)


def test_spec_choices_logging_and_errors():
    spawn(_checks, 1)
