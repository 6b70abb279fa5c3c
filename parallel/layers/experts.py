"""MoE experts as two grouped GEMMs: a drop-in for megatron-core's ``SequentialMLP``.

``GroupedSequentialMLP`` keeps ``SequentialMLP``'s modules and parameters exactly
(``local_experts.{i}.linear_fc1.weight`` [2F or F, H], ``local_experts.{i}.linear_fc2.weight``
[H, F], optional biases), so checkpoints, ``sharded_state_dict`` (inherited) and Hugging Face
weight mappings are unchanged. Only ``forward`` differs: instead of calling each expert's ``MLP``
in a Python loop it runs fc1 for all local experts in one grouped GEMM, the activation once over
every routed token, and fc2 in a second grouped GEMM. Tokens arrive sorted by local expert
(megatron's dispatchers guarantee it, with or without expert parallelism), so the module is
EP-aware by construction: it only ever sees this rank's experts. Expert linears never communicate
inside themselves (the dispatcher does), so expert tensor parallelism needs nothing here either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl
from megatron.core.transformer.moe.experts import SequentialMLP

from parallel.layers.grouped_gemm import grouped_linear


class GroupedSequentialMLP(SequentialMLP):
    """``SequentialMLP`` with the same parameters, computed by grouped GEMMs."""

    def __init__(self, num_local_experts, config, submodules, pg_collection=None, name=None):
        _check_supported(config)
        super().__init__(num_local_experts, config, submodules, pg_collection=pg_collection, name=name)

    def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
        """Same contract as ``SequentialMLP.forward``: returns (output [T, H], None)."""
        hidden, probs = permuted_local_hidden_states, permuted_probs
        if self.config.moe_apply_probs_on_input:
            if self.config.moe_router_topk != 1:
                raise ValueError("moe_apply_probs_on_input needs moe_router_topk=1")
            hidden = (probs.unsqueeze(-1) * hidden).to(hidden.dtype)
            probs = torch.ones_like(probs)
        counts = tokens_per_expert.to(hidden.device)
        fc1 = [expert.linear_fc1 for expert in self.local_experts]
        fc2 = [expert.linear_fc2 for expert in self.local_experts]
        intermediate = grouped_linear(hidden, [layer.weight for layer in fc1], counts)
        intermediate = self._activation(intermediate, _per_token_bias(fc1, counts, hidden.shape[0]), probs)
        output = grouped_linear(intermediate, [layer.weight for layer in fc2], counts)
        bias = _per_token_bias(fc2, counts, hidden.shape[0])
        if bias is not None:
            output = output + bias * probs.unsqueeze(-1)
        return output, None

    def _activation(self, x, bias, probs):
        """The activation of megatron's ``MLP.forward`` (local path), then the routing weight."""
        config = self.config
        if config.bias_activation_fusion and bias is None:
            return weighted_bias_swiglu_impl(x, None, probs.unsqueeze(-1), config.activation_func_fp8_input_store)
        if bias is not None:
            x = x + bias
        if config.gated_linear_unit:
            x_glu, x_linear = torch.chunk(x, 2, dim=-1)
            if (clamp := config.activation_func_clamp_value) is not None:
                x_glu = x_glu.clamp(min=None, max=clamp)
                x_linear = x_linear.clamp(min=-clamp, max=clamp)
            x = config.activation_func(x_glu) * (x_linear + config.glu_linear_offset)
        else:
            x = config.activation_func(x)
        return (x * probs.unsqueeze(-1)).to(x.dtype)


def _per_token_bias(layers, counts: torch.Tensor, num_tokens: int) -> torch.Tensor | None:
    """Each token's expert bias [T, out], or None when the experts have no bias."""
    if layers[0].bias is None:
        return None
    expert_of_token = torch.repeat_interleave(
        torch.arange(len(layers), device=counts.device), counts, output_size=num_tokens
    )
    return torch.stack([layer.bias for layer in layers])[expert_of_token]


def _check_supported(config) -> None:
    """Configurations the grouped path does not reproduce exactly, with the way out."""
    if config.fp8 or config.fp4:
        raise ValueError("fp8/fp4 experts need Transformer Engine: use the TE layer spec (prefer='te')")
    if config.use_te_activation_func:
        raise ValueError("use_te_activation_func needs Transformer Engine: set it False or use prefer='te'")
    if config.moe_latent_size is not None:
        raise ValueError("moe_latent_size is not supported by the grouped experts: use prefer='local'")
    if config.bias_activation_fusion and not (config.gated_linear_unit and config.activation_func is F.silu):
        raise ValueError("bias_activation_fusion in MoE experts needs SwiGLU (gated_linear_unit with silu)")
    if config.bias_activation_fusion and config.add_bias_linear:
        raise ValueError("bias_activation_fusion with expert biases is unsupported: set add_bias_linear=False")
