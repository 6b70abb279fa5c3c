"""Run megatron-core on CPU over gloo: every CUDA assumption it makes, answered in one place.

Call :func:`enable` once per process, before importing ``megatron.core``, and only when CUDA is
absent (it is a no-op otherwise). Each workaround names the megatron-core 0.19.2 line it answers.
Nothing else in megatron-rl knows about this module except the process-group setup that calls it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

_enabled = False


def enable() -> bool:
    """Patch torch and megatron-core for CPU; return True if patches were applied."""
    global _enabled
    if torch.cuda.is_available():
        return False
    if _enabled:
        return True
    _import_paged_stash_without_triton()
    _patch_torch_cuda()
    _patch_megatron()
    _CudaToCpu().__enter__()
    _enabled = True
    return True


class _CudaToCpu(TorchFunctionMode):
    """Rewrites ``device="cuda"`` (and ``torch.device("cuda")``) arguments to the CPU.

    megatron-core hard-codes the device in about 47 places, e.g. ``pipeline_parallel/schedules.py``
    (``torch.zeros(1, device="cuda")`` for the loss reduction), ``optimizer/clip_grads.py``
    (``torch.tensor([0.0], device="cuda")`` for the grad norm), ``optimizer/distrib_optimizer.py``
    (``device=torch.cuda.current_device()``) and ``transformer/moe/*`` (token counts).
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and _is_cuda(device):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # optimizer/distrib_optimizer.py:401,466 and optimizer/optimizer.py:1009,1028 accept only
            # parameters whose type() names a CUDA tensor.
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
            if func is torch.Tensor.cuda:
                return args[0]
        return func(*args, **kwargs)


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


def _import_paged_stash_without_triton() -> None:
    """``transformer/moe/ops/paged_stash.py:4`` does ``import triton`` at import time, and
    ``pipeline_parallel/schedules.py:27`` imports it unconditionally; triton has no CPU build.

    That one file is loaded here by path (its parent packages are not imported) while a stand-in
    ``triton`` (``jit`` as identity, ``language.constexpr``) is in ``sys.modules``; the stand-in is
    removed right after, so nothing else ever sees it (a fake ``triton`` breaks ``torch._inductor``).
    Its kernels are GPU-only and never called on CPU.
    """
    if importlib.util.find_spec("triton") is not None:
        return
    name = "megatron.core.transformer.moe.ops.paged_stash"
    package = importlib.util.find_spec("megatron").submodule_search_locations[0]
    path = f"{package}/core/transformer/moe/ops/paged_stash.py"
    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    language.constexpr = object
    triton.jit = lambda fn=None, **_: fn if fn is not None else (lambda f: f)
    triton.language = language
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]
    sys.modules[name] = module


class _CpuEvent:
    """Stands in for ``torch.cuda.Event``: CPU work has already happened when it is recorded."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _CpuStream:
    """Stands in for ``torch.cuda.Stream``: CPU work is already ordered, so all streams are one."""

    def __init__(self, *args, **kwargs):
        pass

    def __eq__(self, other) -> bool:
        return isinstance(other, _CpuStream)

    def __hash__(self) -> int:
        return 0

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return event or _CpuEvent()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _patch_torch_cuda() -> None:
    cuda = torch.cuda
    # tensor_parallel/random.py:127,165, distributed/distributed_data_parallel.py:297 and the
    # optimizer pass ``torch.cuda.current_device()`` as a tensor device.
    cuda.current_device = lambda: "cpu"
    # tensor_parallel/random.py:303-306 (CudaRNGStatesTracker.add) seeds and reads the CUDA generator
    # even with dropout 0; the CPU generator takes its place.
    cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    # distributed/distributed_data_parallel.py:297 param_and_grad_buffer.py:632-814 and
    # transformer/moe/token_dispatcher.py:921-925 create and order side streams.
    cuda.Stream = _CpuStream
    cuda.current_stream = lambda device=None: _CpuStream()
    cuda.stream = lambda stream=None: _CpuStream()
    # transformer/moe/token_dispatcher.py:946-950 records and waits on a device-to-host event.
    cuda.Event = _CpuEvent
    # schedules.py and the optimizer call these around steps.
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None
    cuda.memory_allocated = lambda device=None: 0
    cuda.max_memory_allocated = lambda device=None: 0


def _split_sizes_to_cpu(tensor, as_numpy: bool = False, record_stream: bool = False):
    """``transformer/moe/moe_utils.py:1184`` converts split sizes to numpy only for CUDA tensors;
    on CPU they would reach ``all_to_all_single`` (``tensor_parallel/mappings.py:460``) as tensors,
    which gloo rejects. They become numpy arrays here, as on GPU."""
    if as_numpy and torch.is_tensor(tensor):
        return tensor.numpy()
    return tensor


def _patch_megatron() -> None:
    from megatron.core.tensor_parallel import random as mc_random
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    moe_utils.maybe_move_tensor_to_cpu = _split_sizes_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = _split_sizes_to_cpu

    # tensor_parallel/random.py:104-166: the tracker's get/set go through CUDA generators.
    mc_random._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: (
        torch.get_rng_state().clone() if clone else torch.get_rng_state()
    )
    mc_random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(
        new_state
    )
