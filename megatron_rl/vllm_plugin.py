"""vLLM general plugin (entry point ``vllm.general_plugins``): a managed server's engine core dies with its API
server.

vLLM's engine core has no link to the API server that spawned it: SIGKILL the API server (Slurm's ``scancel``
after its ``KillWait``, the OOM killer) and the engine core lives on as an orphan, holding its memory and cores,
blocked where it was. Measured on vLLM 0.32 CPU: 10 s after the API server's SIGKILL the engine core was still
running, with or without its worker in a process apart. In a process that a managed server started
(``MEGATRON_RL_ENGINE_DIES_WITH_SERVER=1`` in its environment) the engine core asks the kernel for SIGKILL when
its parent dies (PR_SET_PDEATHSIG); workers in processes apart already end when the engine core does (vLLM's
death pipe). Every other vLLM process, a user's own ``vllm serve`` among them, is left as it is.
"""

import ctypes
import multiprocessing
import os
import signal

from megatron_rl.env_vars import ENGINE_DIES_WITH_SERVER

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that started it dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def register() -> None:
    """Called by vLLM in each of its processes; acts only in a managed server's engine core."""
    parent = multiprocessing.parent_process()
    if os.environ.get(ENGINE_DIES_WITH_SERVER) != "1" or parent is None:
        return
    if not multiprocessing.current_process().name.startswith("EngineCore"):
        return
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent.pid:  # the API server died before the request took effect
        os._exit(1)
