"""Where the run's processes go: the placement section of the config, node labels, the cluster's shape."""

from megatron_rl.runtime.config import PlacementConfig

__all__ = ["PlacementConfig"]
