"""megatron-rl: the RL loop (contracts, algorithms, generator, inference fleet, schedules, CLI)."""

__version__ = "0.1.0"
