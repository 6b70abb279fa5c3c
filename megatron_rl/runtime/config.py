"""``placement.*``: which nodes the trainer ranks and the managed vLLM servers run on.

Nodes are picked by Ray custom resources (labels a node is started with, e.g.
``ray start --resources='{"trainer_node": 8}'``): each trainer rank's actor and each server's actor asks
for the resources given here, so Ray puts it on a node that carries them. Every process then binds to
the address of the node it landed on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SERVER_LAUNCHERS = ("local", "ray")


@dataclass
class PlacementConfig:
    """``placement.*``: where the trainer ranks and the managed inference servers run."""

    servers: str = "local"
    """local: managed vLLM servers are subprocesses of the driver, on its host; ray: each is started by a Ray
    actor on the node Ray picks for it (by ``server_resources``), bound to that node's address."""
    trainer_resources: dict = field(default_factory=dict)
    """Ray custom resources each trainer rank asks for (node labels, e.g. {trainer_node: 1}); empty: any node."""
    server_resources: dict = field(default_factory=dict)
    """Ray custom resources each managed server's actor asks for (with ``servers=ray``); empty: any node."""

    layout: str = "disaggregated"
    """disaggregated: inference engines on GPUs of their own; colocated: engines on the trainer's GPUs (engine j on
    trainer ranks j*g .. j*g+g-1, g = its TP x PP), sleeping while the trainer works."""
    trainer_strategy: str = "PACK"
    """Ray placement strategy of the trainer ranks' bundles: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD."""
    inference_strategy: str = "SPREAD"
    """Ray placement strategy of the engines' bundles (one bundle per engine: its GPUs always share a node)."""

    def __post_init__(self) -> None:
        from megatron_rl.runtime.placement import LAYOUTS, STRATEGIES

        if self.layout not in LAYOUTS:
            raise ValueError(f"placement.layout={self.layout!r}: use one of {LAYOUTS}")
        for key in ("trainer_strategy", "inference_strategy"):
            if getattr(self, key) not in STRATEGIES:
                raise ValueError(f"placement.{key}={getattr(self, key)!r}: use one of {STRATEGIES}")
        if self.servers not in SERVER_LAUNCHERS:
            raise ValueError(f"placement.servers={self.servers!r}: use one of {SERVER_LAUNCHERS}")
        if self.server_resources and self.servers != "ray":
            raise ValueError("placement.server_resources: only Ray-launched servers are placed; set placement.servers=ray")
        for key, resources in (("trainer_resources", self.trainer_resources), ("server_resources", self.server_resources)):
            bad = {k: v for k, v in dict(resources).items() if not isinstance(v, (int, float)) or v <= 0}
            if bad:
                raise ValueError(f"placement.{key}: amounts must be positive numbers, got {bad}")
