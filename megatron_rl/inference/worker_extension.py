"""The vLLM worker extension: small mixins composed into one class that vLLM injects into every
worker (``--worker-extension-cls megatron_rl.inference.worker_extension.MegatronRLWorkerExtension``).
Methods are called through ``/collective_rpc``; arguments arrive as strings.

``RoutingCaptureMixin`` records the experts each MoE layer routes every token to, per request, for
rollout routing replay (R3) where vLLM's native ``enable_return_routed_experts`` cannot run (the
CPU build: it needs Model Runner V2, which needs Triton). It hooks each MoE block's gate and takes
the top-k of the router logits, which equals the router's choice for softmax top-k routers
(Qwen2/Qwen3-MoE, Mixtral); routers with score biases or group limits (DeepSeek-V3) need the
native path. Tokens served from the prefix cache are not recomputed and so have no record: the
result says from which position the record starts. A request computed again (resumed after a pause
whose weight update dropped its KV cache, or preempted) keeps, per position, the routing of its latest
computation: the one its cached keys and values, and so its later tokens, came from.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from weight_transfer.vllm_receiver import WeightReceiver

_MAX_KEPT_REQUESTS = 4096


class RoutingCaptureMixin:
    """Per-request top-k expert indices [tokens, layers, top_k] captured by hooks on MoE gates."""

    def mrl_start_routing_capture(self) -> int:
        """Hook every MoE gate (idempotent); returns the number of MoE layers hooked (0: dense)."""
        if getattr(self, "_mrl_gates", None) is not None:
            return len(self._mrl_gates)
        model = self.model_runner.get_model()
        self._mrl_top_k = getattr(self.model_runner.model_config.hf_config, "num_experts_per_tok", 1)
        self._mrl_gates = [m.gate for _, m in model.named_modules() if hasattr(m, "gate") and hasattr(m, "experts")]
        self._mrl_step: list[torch.Tensor | None] = [None] * len(self._mrl_gates)
        self._mrl_routed: OrderedDict[str, dict] = OrderedDict()
        for layer, gate in enumerate(self._mrl_gates):
            gate.register_forward_hook(self._mrl_gate_hook(layer))
        runner = self.model_runner
        execute = runner.execute_model

        def execute_and_record(scheduler_output, *args, **kwargs):
            out = execute(scheduler_output, *args, **kwargs)
            self._mrl_record_step(scheduler_output)
            return out

        runner.execute_model = execute_and_record
        return len(self._mrl_gates)

    def _mrl_gate_hook(self, layer: int):
        def hook(module, inputs, output):
            logits = output[0] if isinstance(output, tuple) else output
            self._mrl_step[layer] = logits.topk(self._mrl_top_k, dim=-1).indices.to(torch.int16)
        return hook

    def _mrl_record_step(self, scheduler_output) -> None:
        """Split this step's tokens among its requests (laid out in input-batch order)."""
        if any(t is None for t in self._mrl_step) or not scheduler_output.num_scheduled_tokens:
            return
        step = torch.stack(self._mrl_step, dim=1)  # [tokens, layers, top_k]
        self._mrl_step = [None] * len(self._mrl_step)
        # the position of each request's first scheduled token: new requests start after their cached prefix,
        # running ones where their computed tokens end (back at 0 when a resumed request is computed again)
        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        offset = 0
        for req_id in self.model_runner.input_batch.req_ids:
            count = scheduler_output.num_scheduled_tokens.get(req_id, 0)
            if not count:
                continue
            chunks = self._mrl_routed.setdefault(req_id, {"chunks": []})["chunks"]
            start = computed.get(req_id, chunks[-1][0] + len(chunks[-1][1]) if chunks else 0)
            chunks.append((start, step[offset : offset + count].clone()))
            offset += count
        while len(self._mrl_routed) > _MAX_KEPT_REQUESTS:
            self._mrl_routed.popitem(last=False)

    def mrl_pop_routed_experts(self, request_id: str) -> dict | None:
        """Remove and return the record of the request whose engine id starts with ``request_id``
        (vLLM suffixes the id the client sees): {"start": first position, "experts": nested list}."""
        key = next((k for k in self._mrl_routed if k.startswith(request_id)), None)
        if key is None:
            return None
        chunks = self._mrl_routed.pop(key)["chunks"]
        start = min(position for position, _ in chunks)
        end = max(position + len(rows) for position, rows in chunks)
        experts = chunks[0][1].new_empty((end - start, *chunks[0][1].shape[1:]))
        covered = torch.zeros(end - start, dtype=torch.bool)
        for position, rows in chunks:  # in computation order: a later computation of a position wins
            experts[position - start : position - start + len(rows)] = rows
            covered[position - start : position - start + len(rows)] = True
        if not covered.all():
            return None  # a gap: some positions were never computed here
        return {"start": start, "experts": experts.tolist()}


class WeightVersionMixin:
    """The served weights' version tag, for servers without vLLM's ``/update_weight_version`` (vLLM 0.26)."""

    def mrl_set_weight_version(self, version: str) -> None:
        self._mrl_weight_version = version

    def mrl_weight_version(self) -> str | None:
        return getattr(self, "_mrl_weight_version", None)


class MegatronRLWorkerExtension(RoutingCaptureMixin, WeightVersionMixin, WeightReceiver):
    """Everything megatron-rl adds to a vLLM worker: routing capture, the version tag and the weight receiver."""
