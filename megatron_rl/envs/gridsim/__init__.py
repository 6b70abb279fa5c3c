"""``gridsim``: grid-battery scheduling over hourly prices, scored against the exact optimum."""

from megatron_rl.envs.gridsim.env import GridSimConfig, GridSimEnv
from megatron_rl.envs.gridsim.tasks import generate_rows

__all__ = ["GridSimConfig", "GridSimEnv", "generate_rows"]
