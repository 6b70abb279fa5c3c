"""The policy's ranks as Ray actors (one process per rank, torch.distributed inside): the loop's handle.

Every call fans out to all ranks (megatron's collectives need each rank to take part) and returns
the answer of the rank that holds it: log-probs from rank 0 (every rank has them), train metrics
from the last rank (the last pipeline stage).
"""

from __future__ import annotations

import dataclasses
import socket
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import ray
import torch

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.contracts import TrainingBatch
from parallel.config import TrainerConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _PolicyRank:
    """One rank: a MegatronPolicy plus a scratch dict that code run on the rank may keep state in."""

    def __init__(self, hf_dir: str, cfg: TrainerConfig, algorithm: AlgorithmConfig, rank: int, world: int, init: str):
        from parallel.policy import MegatronPolicy

        self.policy = MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init)
        self.scratch: dict = {}

    def ready(self) -> bool:
        return True

    def call(self, method: str, *args, **kwargs):
        return _plain_errors(getattr(self.policy, method), *args, **kwargs)

    def run(self, fn: Callable, *args):
        return _plain_errors(fn, self.policy, self.scratch, *args)


class RankError(RuntimeError):
    """A rank's exception, carried as text: the driver never imports megatron to unpickle it."""


def _convert(obj, tensor_fn):
    """``obj`` with every tensor (or array) replaced by ``tensor_fn(it)``, through containers and dataclasses."""
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return tensor_fn(obj)
    if isinstance(obj, dict):
        return {k: _convert(v, tensor_fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_convert(v, tensor_fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return type(obj)(**{f.name: _convert(getattr(obj, f.name), tensor_fn) for f in dataclasses.fields(obj)})
    return obj


def _to_wire(obj):
    """Tensors leave a rank as numpy arrays: megatron registers its own storage pickler in every process
    that imports it, and a tensor pickled there would make the driver import megatron to load it."""
    return _convert(obj, lambda t: t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t)


def _from_wire(obj):
    return _convert(obj, lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a)


def _plain_errors(fn: Callable, *args, **kwargs):
    try:
        return _to_wire(fn(*args, **kwargs))
    except Exception as err:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else "?"
        raise RankError(f"trainer rank {rank}: {type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}") from None


class WorkerGroup:
    """``world_size`` policy ranks laid out by ``cfg.parallel`` (data parallel takes the rest)."""

    def __init__(self, hf_dir: str | Path, cfg: TrainerConfig, algorithm: AlgorithmConfig, world_size: int = 1):
        cfg.parallel.check_world(world_size)
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=True, configure_logging=False)
        gpus = 1 if torch.cuda.is_available() else 0
        actor = ray.remote(num_cpus=0, num_gpus=gpus)(_PolicyRank)
        init = f"tcp://127.0.0.1:{_free_port()}"
        self.world_size = world_size
        self.ranks = [actor.remote(str(hf_dir), cfg, algorithm, r, world_size, init) for r in range(world_size)]
        self._all("ready")  # every rank has built and loaded its model (errors surface here)

    def _all(self, verb: str, *args, **kwargs) -> list:
        return _from_wire(ray.get([getattr(r, verb).remote(*args, **kwargs) for r in self.ranks]))

    def compute_logprobs(self, batch: TrainingBatch, record_routing: bool = False):
        """(log-probs, entropy, routed experts or None) for every row, ``[B, T]``."""
        return self._all("call", "compute_logprobs", batch, record_routing=record_routing)[0]

    def train_step(self, batch: TrainingBatch, algorithm: AlgorithmConfig | None = None) -> dict[str, float]:
        return self._all("call", "train_step", batch, algorithm)[-1]

    def save(self, path: Path) -> None:
        self._all("call", "save", str(path))

    def load(self, path: Path) -> None:
        self._all("call", "load", str(path))

    def memory(self) -> list[dict]:
        return self._all("call", "memory")

    def run(self, fn: Callable, *args) -> list:
        """``fn(policy, scratch, *args)`` on every rank at once; each rank's result, in rank order."""
        return self._all("run", fn, *args)

    def shutdown(self) -> None:
        for r in self.ranks:
            ray.kill(r)
        self.ranks = []
