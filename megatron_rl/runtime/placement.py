"""Which node each bundle of the run goes to, decided before anything starts, as Ray's placement-group
strategies would place them; a layout that cannot fit fails here, saying what is missing.

Bundles: one per trainer rank (a GPU each on a GPU cluster), one per inference engine (its TP x PP GPUs, on
one node), one for the driver (a CPU). ``disaggregated`` engines take GPUs of their own; ``colocated``
engines run on the GPUs of consecutive trainer ranks (engine j on ranks j*g .. j*g+g-1), which must then
share a node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_rl.runtime.cluster import Cluster, Node

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
LAYOUTS = ("disaggregated", "colocated")


class PlacementError(ValueError):
    """The layout does not fit the cluster; the message names what is missing."""


@dataclass(frozen=True)
class BundleGroup:
    role: str
    count: int
    gpus: int
    """GPUs of one bundle (all on one node)."""
    cpus: float
    strategy: str = "PACK"
    labels: dict = field(default_factory=dict)
    """Ray custom resources each bundle needs from its node."""
    sized_by: str = ""
    """The config keys that set the bundle's size, named in errors."""


@dataclass
class Placement:
    layout: str
    nodes: dict[str, list[str]]
    """Role -> the node of each of its bundles, in bundle order."""
    gpus: dict[str, int]
    """Role -> GPUs per bundle."""

    def table(self) -> list[str]:
        lines = []
        for role, nodes in self.nodes.items():
            by_node: dict[str, list[int]] = {}
            for i, node in enumerate(nodes):
                by_node.setdefault(node, []).append(i)
            where = ", ".join(f"{node}: {_ranges(ids)}" for node, ids in by_node.items())
            lines.append(f"{role:<10} {len(nodes)} bundle(s) x {self.gpus[role]} GPU  {where}")
        return lines


def _ranges(ids: list[int]) -> str:
    return f"#{ids[0]}" if len(ids) == 1 else f"#{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else str(ids)


class _Free:
    """What each node still has free while bundles are placed."""

    def __init__(self, cluster: Cluster):
        self.nodes = list(cluster.nodes)
        self.gpus = {n.name: n.gpus for n in cluster.nodes}
        self.cpus = {n.name: n.cpus for n in cluster.nodes}
        self.labels = {n.name: dict(n.labels) for n in cluster.nodes}

    def fits(self, node: Node, group: BundleGroup, times: int = 1) -> bool:
        return (self.gpus[node.name] >= group.gpus * times and self.cpus[node.name] >= group.cpus * times
                and all(self.labels[node.name].get(k, 0) >= v * times for k, v in group.labels.items()))

    def take(self, node: Node, group: BundleGroup) -> None:
        self.gpus[node.name] -= group.gpus
        self.cpus[node.name] -= group.cpus
        for k, v in group.labels.items():
            self.labels[node.name][k] -= v


def _check_possible(group: BundleGroup, cluster: Cluster, free: _Free) -> list[Node]:
    eligible = [n for n in cluster.nodes if all(n.labels.get(k, 0) >= v for k, v in group.labels.items())]
    if not eligible:
        carried = {n.name: n.labels for n in cluster.nodes}
        raise PlacementError(f"placement: no node carries {group.labels} for the {group.role} ({group.sized_by}); "
                             f"the nodes carry {carried}")
    largest = max(n.gpus for n in eligible)
    if group.gpus > largest:
        raise PlacementError(f"placement: one {group.role} bundle needs {group.gpus} GPUs on one node ({group.sized_by}); "
                             f"the largest eligible node has {largest}")
    need, have = group.gpus * group.count, sum(free.gpus[n.name] for n in eligible)
    if need > have:
        raise PlacementError(f"placement: the {group.role} needs {need} GPUs ({group.count} x {group.gpus}, {group.sized_by}); "
                             f"the eligible nodes have {have} free — {need - have} GPUs missing")
    return eligible


def _place_group(group: BundleGroup, cluster: Cluster, free: _Free) -> list[str]:
    eligible = _check_possible(group, cluster, free)
    if group.strategy == "STRICT_PACK":
        node = next((n for n in eligible if free.fits(n, group, group.count)), None)
        if node is None:
            raise PlacementError(f"placement: STRICT_PACK puts all {group.count} {group.role} bundles "
                                 f"({group.count * group.gpus} GPUs) on one node; no node has that free")
        for _ in range(group.count):
            free.take(node, group)
        return [node.name] * group.count
    chosen: list[str] = []
    for _ in range(group.count):
        options = [n for n in eligible if free.fits(n, group)]
        if group.strategy == "STRICT_SPREAD":
            options = [n for n in options if n.name not in chosen]
        if not options:
            raise PlacementError(f"placement: {group.role} bundle {len(chosen)} of {group.count} fits no node "
                                 f"({group.strategy}; {group.gpus} GPUs, {group.cpus} CPUs, labels {group.labels})")
        if group.strategy == "PACK":  # stay on the node in use while it has room, else the fullest-free node
            node = next((n for n in options if chosen and n.name == chosen[-1]), None) or \
                max(options, key=lambda n: free.gpus[n.name])
        else:  # spread: the node with the fewest bundles of this group so far
            node = min(options, key=lambda n: (chosen.count(n.name), -free.gpus[n.name]))
        free.take(node, group)
        chosen.append(node.name)
    return chosen


def _colocate(trainer_nodes: list[str], engines: BundleGroup) -> list[str]:
    if engines.count * engines.gpus > len(trainer_nodes):
        raise PlacementError(f"placement.layout=colocated: {engines.count} engines x {engines.gpus} GPUs "
                             f"({engines.sized_by}) need more GPUs than the trainer's {len(trainer_nodes)}")
    nodes = []
    for j in range(engines.count):
        span = set(trainer_nodes[j * engines.gpus:(j + 1) * engines.gpus])
        if len(span) != 1:
            raise PlacementError(f"placement.layout=colocated: engine {j} would span trainer ranks on nodes "
                                 f"{sorted(span)}; an engine's GPUs must share one node (pack the trainer)")
        nodes.append(span.pop())
    return nodes


def place(groups: list[BundleGroup], cluster: Cluster, layout: str = "disaggregated") -> Placement:
    """Every group's bundles on nodes, in order (trainer first); PlacementError when something does not fit."""
    if layout not in LAYOUTS:
        raise PlacementError(f"placement.layout={layout!r}: use one of {LAYOUTS}")
    free = _Free(cluster)
    nodes: dict[str, list[str]] = {}
    for group in groups:
        if group.strategy not in STRATEGIES:
            raise PlacementError(f"placement: strategy {group.strategy!r} for the {group.role}; use one of {STRATEGIES}")
        if layout == "colocated" and group.role == "inference":
            nodes[group.role] = _colocate(nodes["trainer"], group)
        else:
            nodes[group.role] = _place_group(group, cluster, free)
    return Placement(layout, nodes, {g.role: g.gpus for g in groups})
