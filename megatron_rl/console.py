"""The console a person reads: known third-party noise filtered in every process, one line per step with
time left, a progress bar on a terminal, and a closing summary. ``run.verbose=true`` shows everything.

Filters reach every process a run starts: the driver (here), the Ray actors (a job-wide
``worker_process_setup_hook`` runs ``quiet_process`` before any actor), and the vLLM servers (they
inherit ``PYTHONWARNINGS``). Errors and unknown warnings still print in full.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
import warnings

import tqdm

# Warnings every CPU run prints and nobody can act on (message starts; no ':' or ',' so PYTHONWARNINGS can carry them).
QUIET_WARNINGS = (
    "Transformer Engine and Apex are not installed",
    "Apex is not installed",
    "absl.logging is not installed",
    "full scope is deprecated",
    "MimoModelConfig is experimental",
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed",
    "`torch.distributed.reduce_scatter_tensor` is deprecated",
    "`torch.distributed.all_gather_into_tensor` is deprecated",
    # GPU: torch's barrier() on an NCCL group bound to no device (megatron-core's own barriers), and the escape
    # sequence megatron-core's kv_block_allocator docstring has, printed as a site without .pyc files compiles it.
    "barrier()",
    "invalid escape sequence",
)
# Loggers whose warnings are notices to megatron developers (GPTModel deprecation, DDP layout auto-computed), and
# Ray's notice that a local cluster turned token authentication on by default.
QUIET_LOGGERS = ("megatron.core.models.gpt.gpt_model", "megatron.core.distributed.distributed_data_parallel",
                 "ray._private.authentication.authentication_token_setup")
# A notice megatron-core logs on a path it takes itself: its synchronous checkpoint save runs through the async
# route it calls deprecated. (logger, message start): only that message is dropped, the logger's others print.
QUIET_LOG_MESSAGES = (("megatron.core.dist_checkpointing.strategies.torch", "MCore's async save is deprecated"),)
SETUP_HOOK = "megatron_rl.console.quiet_process"


class _DropMessage(logging.Filter):
    """Drops a logger's records whose message starts with ``start``."""

    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def quiet_process() -> None:
    """Drop the known third-party warnings in this process (Ray runs it in each worker before its actor)."""
    for text in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(text))
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name, start in QUIET_LOG_MESSAGES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.start == start for f in logger.filters):
            logger.addFilter(_DropMessage(start))
    # transformers' own bars ("Writing model shards" as the tiny model is saved): read at its import, so the
    # variable covers this process's later import and every child; an earlier import is switched off directly.
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


class _TqdmHandler(logging.Handler):
    """Writes records above any progress bar (``tqdm.write``), one line each."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.tqdm.write(self.format(record).rstrip("\n"), file=sys.stderr)
        except Exception:
            self.handleError(record)


def setup(verbose: bool) -> None:
    """Console logging for the driver; unless ``verbose``, quiet this process, its children and Ray's workers."""
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    if verbose:
        return
    quiet_process()
    os.environ["PYTHONWARNINGS"] = python_warnings(os.environ.get("PYTHONWARNINGS", ""))
    import ray

    if not ray.is_initialized():  # the same call as parallel.worker_group.start_ray, plus the hook
        ray.init(include_dashboard=False, log_to_driver=True, configure_logging=False,
                 runtime_env={"worker_process_setup_hook": SETUP_HOOK})
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_term)


def _exit_on_term(signum: int, frame) -> None:
    """SIGTERM stops the driver as Ray's own handler does (``SystemExit``: every ``finally`` runs, the summary
    prints), without the native stack dump that the handler Ray's core worker chains in front of it prints."""
    sys.exit(signum)


def python_warnings(existing: str) -> str:
    """``PYTHONWARNINGS`` for child processes (the vLLM servers): ``existing`` plus the known warnings ignored."""
    return ",".join(filter(None, [existing, *(f"ignore:{text}" for text in QUIET_WARNINGS)]))


def bar(total: int, desc: str) -> tqdm.tqdm:
    """A progress bar with time remaining on a terminal; nothing when stderr is not one (logs, CI)."""
    return tqdm.tqdm(total=total, desc=desc, leave=False, disable=None, file=sys.stderr, dynamic_ncols=True)


class StepClock:
    """``[step/total, m:ss left]`` from the mean time of the steps since the clock started."""

    def __init__(self, total: int, now=time.monotonic):
        self.total, self.now = total, now
        self.start: tuple[int, float] | None = None

    def tag(self, step: int) -> str:
        """The clock (re)starts at the last line of its first step (step 0: after SFT and the first eval)."""
        now = self.now()
        if self.start is None or step <= self.start[0]:
            self.start = (step, now)
            return f"[{step}/{self.total}]"
        first, began = self.start
        left = (now - began) / (step - first) * max(self.total - step, 0)
        return f"[{step}/{self.total}, {format_seconds(left)} left]"


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}:{secs:02d}"
