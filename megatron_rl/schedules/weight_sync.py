"""Weight sync for a run: the trainer's ranks send through the transfer plan to every fleet replica.

The plan is built from the checkpoint's tensor names and shapes (read from safetensors headers, no
weights loaded) and the trainer's layout; every update then runs weight_transfer's protocol
(connect → send/receive → pause → verify + load → resume) and tags the fleet with the new version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from pathlib import Path
from urllib.parse import urlparse

import torch

from megatron_rl.inference.auth import auth_header
from megatron_rl.runtime.plan import trainer_layout
from parallel.config import TrainerConfig
from parallel.worker_group import WorkerGroup, free_port, node_address
from weight_transfer.config import Route, WeightTransferConfig
from weight_transfer.coordinator import WeightTransferCoordinator, WeightTransferError
from weight_transfer.plan import TensorSpec, TransferPlan
from weight_transfer.replicas import HTTPReplica

log = logging.getLogger("megatron_rl")
RDMA_DEVICES = Path("/sys/class/infiniband")


def checkpoint_specs(model_dir: Path, dtype: str) -> list[TensorSpec]:
    """Name and shape of every tensor in the checkpoint's safetensors files, in the trainer's dtype."""
    specs = []
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        specs += [TensorSpec(name, tuple(meta["shape"]), dtype) for name, meta in header.items() if name != "__metadata__"]
    if not specs:
        raise ValueError(f"model.path: no safetensors files in {model_dir}")
    return specs


def build_plan(model_dir: Path, hf_config, trainer: TrainerConfig, world_size: int, bucket_bytes: int) -> TransferPlan:
    layout = trainer_layout(trainer, world_size, hf_config.num_hidden_layers, getattr(hf_config, "num_experts", 0) or 0)
    return TransferPlan.build(checkpoint_specs(model_dir, trainer.dtype), layout, bucket_bytes)


def transfer_route(trainer_nodes: list[str], server_urls: list[str], on_gpu: bool, colocated: bool,
                   rdma: bool) -> Route:
    """What ``weight_transfer.transport.type=auto`` chooses by: every engine on a node holding trainer ranks
    (``same_host``), engines on the trainer's GPUs (``colocated``), GPU buffers, RDMA NICs."""
    engines = {urlparse(url).hostname for url in server_urls}
    return Route(on_gpu=on_gpu, colocated=colocated, same_host=bool(engines) and engines <= set(trainer_nodes),
                 rdma=rdma)


def _on_gpu(policy, scratch) -> bool:
    return torch.cuda.is_available()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _endpoint(policy, scratch) -> tuple[str, int]:
    host = node_address()
    return host, free_port(host)


def _connect(policy, scratch, session: dict) -> None:
    from weight_transfer.transports import make_sender

    rank = torch.distributed.get_rank()
    if scratch.get("wt") is not None:
        scratch.pop("wt").close()
    if str(rank) in session["ports"]:
        scratch["wt"] = make_sender(session, rank, _device())


def _send(policy, scratch, plan_json: str, version: int, digests: bool) -> dict:
    from weight_transfer.sender import send_weights

    if scratch.get("plan_json") != plan_json:
        scratch["plan"], scratch["plan_json"] = TransferPlan.from_json(plan_json), plan_json
    rank = torch.distributed.get_rank()
    return send_weights(scratch["plan"], rank, policy.export_weights(row_blocks=True), scratch.get("wt"), version, _device(), digests)


def _release(policy, scratch, version: int) -> None:
    if scratch.get("wt") is not None:
        scratch["wt"].release(version)


def _disconnect(policy, scratch) -> None:
    if scratch.get("wt") is not None:
        scratch.pop("wt").close()


class PolicySenders:
    """weight_transfer's ``Senders`` over the policy's Ray ranks (each sends what the plan gives it)."""

    def __init__(self, group: WorkerGroup, plan: TransferPlan):
        self.group, self.plan_json = group, plan.to_json()

    def endpoints(self, ranks: list[int]) -> dict[int, tuple[str, int]]:
        return {rank: tuple(e) for rank, e in enumerate(self.group.run(_endpoint)) if rank in ranks}

    def connect(self, session: dict) -> None:
        self.group.run(_connect, session)

    def send(self, version: int, digests: bool) -> dict:
        merged = {"buckets": {}, "tensors": {}}
        for part in self.group.run(_send, self.plan_json, version, digests):
            merged["buckets"].update(part["buckets"])
            merged["tensors"].update(part["tensors"])
        return merged

    def release(self, version: int) -> None:
        self.group.run(_release, version)

    def disconnect(self) -> None:
        self.group.run(_disconnect)


class FleetWeightSync:
    """``await sync(version)``: transfer, verify every replica reports ``version``, tag the fleet."""

    def __init__(self, config: WeightTransferConfig, plan: TransferPlan, group: WorkerGroup, fleet,
                 colocated: bool = False):
        if config.auto:
            rdma = RDMA_DEVICES.is_dir() and any(RDMA_DEVICES.iterdir())  # this node's NICs stand for all nodes'
            route = transfer_route(group.nodes, fleet.server_urls, all(group.run(_on_gpu)), colocated, rdma)
            config = config.for_route(route)
            log.info("weight_transfer: transport auto -> %s (GPU %s, colocated %s, same host %s, RDMA %s)",
                     config.resolved_transport.type, route.on_gpu, route.colocated, route.same_host, route.rdma)
        headers = auth_header(fleet.secret)
        replicas = [HTTPReplica(url, on_quarantine=fleet.router.quarantine, headers=headers) for url in fleet.server_urls]
        self.fleet = fleet
        self.coordinator = WeightTransferCoordinator(config, plan, replicas, PolicySenders(group, plan),
                                                     lost=self._lost_replicas)

    def _lost_replicas(self) -> dict[str, str]:
        """Replicas on nodes Ray counts dead or whose server died: the update stops waiting for them and
        quarantines them (a merely slow answer is no proof here: a healthy replica would be dropped)."""
        nodes = set(self.fleet.lost_nodes(silent_is_lost=False))
        hosts = {r.name: urlparse(r.name).hostname for r in self.coordinator.replicas}
        return {name: f"its node {host} is lost" for name, host in hosts.items() if host in nodes}

    async def __call__(self, version: int) -> dict[str, float]:
        try:
            metrics = await asyncio.to_thread(self.coordinator.update, version)
        except WeightTransferError as err:
            lost = self.fleet.node_loss(err)
            if lost is None:
                raise
            raise lost from err
        await self.fleet.set_weight_version(str(version))
        return metrics
