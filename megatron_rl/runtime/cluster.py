"""A cluster's shape: nodes with GPUs, CPUs and labels, and the network between them.

Written on the command line as ``NODESxGPUSxKIND[@GBITS]`` (``4x8xH100@400``: four nodes of eight H100s,
400 Gb/s per node), or read from a running Ray cluster (``ray_cluster``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

GPU_MEMORY_GB = {"H100": 80, "H200": 141, "A100": 80, "B200": 192, "L40S": 48, "CPU": 0}
"""Memory per GPU kind in GB (10^9 bytes), as the vendors publish it."""
NVLINK_GBYTES_S = {"H100": 370.0, "H200": 370.0, "A100": 240.0, "B200": 740.0, "L40S": 25.0, "CPU": 10.0}
"""A broadcast's bandwidth inside one node in GB/s (H200: measured 369-371 GB/s, PLATFORM.md; others scaled
from their NVLink generation)."""
_SPEC = re.compile(r"^(\d+)x(\d+)x([A-Za-z0-9]+)(?:@(\d+(?:\.\d+)?))?$")


@dataclass(frozen=True)
class Node:
    name: str
    gpus: int
    cpus: float = 64.0
    labels: dict = field(default_factory=dict)
    """Ray custom resources the node carries (what ``placement.*_resources`` select by)."""
    address: str = ""


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[Node, ...]
    gpu_kind: str = "H100"
    network_gbit_s: float = 400.0
    """Per-node network bandwidth in Gb/s (both directions)."""

    @property
    def gpu_bytes(self) -> int:
        return int(GPU_MEMORY_GB[self.gpu_kind] * 1e9)

    @property
    def intra_node_bytes_s(self) -> float:
        return NVLINK_GBYTES_S[self.gpu_kind] * 1e9

    @property
    def network_bytes_s(self) -> float:
        return self.network_gbit_s * 1e9 / 8

    def describe(self) -> str:
        gpus = sorted({n.gpus for n in self.nodes})
        return f"{len(self.nodes)} node(s) x {'/'.join(map(str, gpus))} {self.gpu_kind}, {self.network_gbit_s:g} Gb/s"


def parse_cluster(text: str) -> Cluster:
    """``4x8xH100@400`` -> four nodes node0..node3 of eight H100 each, 400 Gb/s per node."""
    found = _SPEC.match(text.strip())
    if not found or found.group(3).upper() not in GPU_MEMORY_GB:
        raise ValueError(f"cluster={text!r}: write NODESxGPUSxKIND[@GBIT_S], e.g. 4x8xH100@400; "
                         f"kinds: {sorted(GPU_MEMORY_GB)}")
    count, gpus, kind, gbit = int(found.group(1)), int(found.group(2)), found.group(3).upper(), found.group(4)
    if count < 1:
        raise ValueError(f"cluster={text!r}: needs at least one node")
    nodes = tuple(Node(f"node{i}", gpus) for i in range(count))
    return Cluster(nodes, kind, float(gbit) if gbit else 400.0)


_STANDARD = {"CPU", "GPU", "memory", "object_store_memory"}


def ray_cluster() -> Cluster:
    """The live Ray cluster this process is connected to (alive nodes, their GPUs, CPUs and custom labels)."""
    import ray

    nodes = []
    for n in ray.nodes():
        if not n["Alive"]:
            continue
        res = n["Resources"]
        labels = {k: v for k, v in res.items() if k not in _STANDARD and not k.startswith(("node:", "accelerator_type"))}
        nodes.append(Node(n["NodeManagerAddress"], int(res.get("GPU", 0)), res.get("CPU", 0.0), labels,
                          n["NodeManagerAddress"]))
    return Cluster(tuple(nodes), "CPU" if not any(n.gpus for n in nodes) else "H100")
