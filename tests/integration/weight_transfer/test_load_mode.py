"""Which models a replica may load in place (``weight_transfer.load=direct``): only where vLLM processes
nothing after loading. The rule reads the model's modules, so it is checked here on stand-in models; the
GPU tests load real engines both ways."""

from __future__ import annotations

import torch
from torch import nn

from weight_transfer.vllm_receiver import _direct_load_blocker


def _layer(method) -> nn.Module:
    layer = nn.Linear(4, 4)
    layer.quant_method = method
    return layer


def test_direct_load_only_where_vllm_processes_nothing_after_loading():
    from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    cuda = torch.device("cuda")  # only compared, never used
    dense = nn.Sequential(_layer(UnquantizedEmbeddingMethod()), _layer(UnquantizedLinearMethod()), nn.LayerNorm(4))
    assert _direct_load_blocker(dense, cuda) is None
    assert "repacks linear weights" in _direct_load_blocker(dense, torch.device("cpu"))

    class Fp8LinearMethod:  # any quantization method
        pass

    quantized = nn.Sequential(_layer(UnquantizedLinearMethod()), _layer(Fp8LinearMethod()))
    assert _direct_load_blocker(quantized, cuda) == "1: Fp8LinearMethod processes weights after loading"
    moe = nn.Sequential(_layer(UnquantizedLinearMethod()), _layer(object.__new__(UnquantizedFusedMoEMethod)))
    assert "UnquantizedFusedMoEMethod" in _direct_load_blocker(moe, cuda), "fused MoE kernels may re-layout experts"
