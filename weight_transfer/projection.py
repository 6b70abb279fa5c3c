"""Analytic transfer-time projection from a plan: bytes each sender rank puts on its node's links and bytes
each inference node must take in, against given link bandwidths. A lower bound for a bandwidth-bound update
(no latency, no load time), to set expectations next to published numbers."""

from __future__ import annotations

from dataclasses import dataclass

from weight_transfer.plan import TransferPlan


@dataclass(frozen=True)
class Links:
    """Per-node bandwidths in GB/s."""

    inter_node_gbps: float = 400.0
    """Node egress/ingress across the network (e.g. 8 x 400 Gb/s NICs = 400 GB/s)."""
    intra_node_gbps: float = 370.0
    """NVLink broadcast within a node (measured on the H200: 369-371 GB/s at 1-4 GiB)."""


@dataclass(frozen=True)
class Fleet:
    trainer_nodes: int
    inference_nodes: int
    gpus_per_node: int = 8
    inference_tp: int = 8
    """GPUs per inference replica (one replica spans inference_tp / gpus_per_node nodes or shares one)."""


def project(plan: TransferPlan, fleet: Fleet, links: Links) -> dict[str, float]:
    """Seconds for two receive schemes. ``broadcast``: every inference worker gets every HF tensor (as this
    module's broadcast does); a pipelined ring brings the model onto each node once and fans it out over
    NVLink. ``sharded``: each inference GPU receives only its 1/inference_tp share (reshard on the sender)."""
    trainer_gpus = fleet.trainer_nodes * fleet.gpus_per_node
    if plan.layout.world_size != trainer_gpus:
        raise ValueError(f"projection: the layout has {plan.layout.world_size} trainer ranks, the fleet "
                         f"{fleet.trainer_nodes} nodes x {fleet.gpus_per_node} GPUs = {trainer_gpus}")
    per_rank: dict[int, int] = {}
    for bucket in plan.buckets:
        per_rank[bucket.sender] = per_rank.get(bucket.sender, 0) + bucket.nbytes
    per_node: dict[int, int] = {}
    for rank, nbytes in per_rank.items():
        node = rank * fleet.trainer_nodes // plan.layout.world_size
        per_node[node] = per_node.get(node, 0) + nbytes
    egress = max(per_node.values()) / (links.inter_node_gbps * 1e9)
    model = plan.nbytes
    node_in = model / (links.inter_node_gbps * 1e9)
    fan_out = model / (links.intra_node_gbps * 1e9)
    node_share = fleet.gpus_per_node / fleet.inference_tp
    return {"bytes": float(model), "senders": float(len(per_rank)), "sender_node_egress_s": egress,
            "broadcast_s": max(egress, node_in, fan_out),
            "sharded_s": max(egress, node_share * node_in)}
