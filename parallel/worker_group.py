"""The policy's ranks as Ray actors (one process per rank, torch.distributed inside): the loop's handle.

Every call fans out to all ranks (megatron's collectives need each rank to take part) and returns
the answer of the rank that holds it: log-probs from rank 0 (every rank has them), train metrics
from the last rank (the last pipeline stage). The critic (PPO with GAE) and the reference policy
(KL) are optional models in the same rank processes, sharing the policy's layout and groups.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import ray
import torch
import transformers

from megatron_rl.algorithms.config import AlgorithmConfig
from megatron_rl.contracts import TrainingBatch
from parallel.config import CriticConfig, TrainerConfig


LOOPBACK = "127.0.0.1"


def node_address() -> str:
    """The address of the node this process runs on, as Ray knows it; 127.0.0.1 while the cluster is this
    one node, so a one-host run listens on nothing but loopback."""
    alive = [n for n in ray.nodes() if n["Alive"]]
    return LOOPBACK if len(alive) == 1 else ray.util.get_node_ip_address()


def interface_of(address: str) -> str:
    """The name of this host's network interface that carries ``address``."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    raise RuntimeError(f"no network interface of this host carries {address}")


def free_port(host: str) -> int:
    """A TCP port nothing listens on right now on ``host`` (chosen on the node that will bind it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class _PolicyRank:
    """One rank: a MegatronPolicy, the optional critic and reference beside it, and a scratch dict
    that code run on the rank may keep state in. The models are built by ``build`` once rank 0 has
    named the rendezvous on its own node (``rendezvous``)."""

    def rendezvous(self) -> str:
        host = node_address()
        return f"tcp://{host}:{free_port(host)}"

    def build(self, hf_dir: str, cfg: TrainerConfig, algorithm: AlgorithmConfig, rank: int, world: int, init: str,
              critic: CriticConfig | None, reference: bool) -> str:
        from parallel.policy import MegatronPolicy

        os.environ["GLOO_SOCKET_IFNAME"] = interface_of(node_address())  # the groups listen on the node's address
        self.models = {"policy": MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init)}
        policy = self.models["policy"]  # built first: it readies megatron-core for this process (CPU layer)
        from parallel.critic import MegatronCritic
        from parallel.reference import ReferencePolicy

        if critic is not None:
            self.models["critic"] = MegatronCritic(hf_dir, critic.trainer_config(cfg), critic, rank, world, init, policy.pgs)
        if reference:
            self.models["reference"] = ReferencePolicy(policy)
        self.scratch: dict = {}
        return node_address()

    def call(self, method: str, *args, model: str = "policy", **kwargs):
        return _plain_errors(getattr(self.models[model], method), *args, **kwargs)

    def snapshot_reference(self) -> None:
        return _plain_errors(self.models["reference"].snapshot, self.models["policy"])

    def run(self, fn: Callable, *args):
        return _plain_errors(fn, self.models["policy"], self.scratch, *args)


def start_ray() -> None:
    """Join the Ray cluster named by ``RAY_ADDRESS`` when set; otherwise start a one-host Ray."""
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=True, configure_logging=False)


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
    """``world_size`` policy ranks laid out by ``cfg.parallel`` (data parallel takes the rest), with a
    critic when ``critic`` is given and a reference policy when ``reference`` is set. Each rank's actor asks for
    ``resources`` (node labels) and takes its entry of ``actor_options`` (e.g. its placement-group bundle)."""

    def __init__(self, hf_dir: str | Path, cfg: TrainerConfig, algorithm: AlgorithmConfig, world_size: int = 1,
                 critic: CriticConfig | None = None, reference: bool = False, resources: dict | None = None,
                 actor_options: list[dict] | None = None):
        cfg.parallel.check_world(world_size)
        cfg.parallel.check_model(getattr(transformers.AutoConfig.from_pretrained(hf_dir), "num_experts", 0) or 0)
        self.models = ["policy"] + (["critic"] if critic is not None else []) + (["reference"] if reference else [])
        start_ray()
        gpus = 1 if torch.cuda.is_available() else 0
        actor = ray.remote(num_cpus=0, num_gpus=gpus, resources=dict(resources or {}))(_PolicyRank)
        self.world_size = world_size
        self.ranks = [actor.options(**opts).remote() for opts in (actor_options or [{}] * world_size)]
        self.init_method = ray.get(self.ranks[0].rendezvous.remote())
        """Where the ranks met: ``tcp://<rank 0's node address>:<port chosen there>``."""
        self.nodes: list[str] = ray.get([
            actor.build.remote(str(hf_dir), cfg, algorithm, rank, world_size, self.init_method, critic, reference)
            for rank, actor in enumerate(self.ranks)])  # every rank has built and loaded its model (errors surface here)
        """Each rank's node address, in rank order."""

    def _all(self, verb: str, *args, **kwargs) -> list:
        """``verb`` on every rank at once; a batch goes into Ray's object store once and every rank reads it there."""
        args = tuple(ray.put(a) if isinstance(a, TrainingBatch) else a for a in args)
        return _from_wire(ray.get([getattr(r, verb).remote(*args, **kwargs) for r in self.ranks]))

    def compute_logprobs(self, batch: TrainingBatch, record_routing: bool = False):
        """(log-probs, entropy, routed experts or None) for every row, ``[B, T]``."""
        return self._all("call", "compute_logprobs", batch, record_routing=record_routing)[0]

    def train_step(self, batch: TrainingBatch, algorithm: AlgorithmConfig | None = None,
                   lr: float | None = None) -> dict[str, float]:
        return self._all("call", "train_step", batch, algorithm, lr)[-1]

    def compute_values(self, batch: TrainingBatch) -> torch.Tensor:
        """The critic's ``[B, T]`` values (position p: the state before token p)."""
        return self._all("call", "compute_values", batch, model="critic")[0]

    def critic_step(self, batch: TrainingBatch, returns: torch.Tensor, old_values: torch.Tensor) -> dict[str, float]:
        """One critic update toward ``returns``, clipped around ``old_values`` (both ``[B, T]``)."""
        return self._all("call", "train_step", batch, returns, old_values, model="critic")[-1]

    def compute_ref_logprobs(self, batch: TrainingBatch) -> torch.Tensor:
        """The reference policy's ``[B, T]`` log-probs of the batch's tokens."""
        return self._all("call", "compute_logprobs", batch, model="reference")[0]

    def snapshot_reference(self) -> None:
        """Make the reference policy equal the policy's current weights (where RL starts)."""
        self._all("snapshot_reference")

    def save(self, path: Path) -> None:
        """Each model into its own folder under ``path`` (``policy``, and ``critic``/``reference`` when built)."""
        for model in self.models:
            self._all("call", "save", str(Path(path) / model), model=model)

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote; a checkpoint without a model this group has is refused."""
        missing = [m for m in self.models if not (Path(path) / m).is_dir()]
        if missing:
            raise ValueError(
                f"checkpoint {path} has no {', '.join(missing)}: it was written by a run without them "
                "(critic: algorithm.advantage_estimator=gae; reference: algorithm.kl); resume with the run's own settings"
            )
        for model in self.models:
            self._all("call", "load", str(Path(path) / model), model=model)

    def memory(self) -> list[dict]:
        return self._all("call", "memory")

    def run(self, fn: Callable, *args) -> list:
        """``fn(policy, scratch, *args)`` on every rank at once; each rank's result, in rank order."""
        return self._all("run", fn, *args)

    def shutdown(self) -> None:
        for r in self.ranks:
            ray.kill(r)
        self.ranks = []
