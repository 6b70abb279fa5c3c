"""``text2sql``: multi-turn SQL answering and repair against generated SQLite databases."""

from megatron_rl.envs.text2sql.env import Text2SQLConfig, Text2SQLEnv
from megatron_rl.envs.text2sql.tasks import generate_rows

__all__ = ["Text2SQLConfig", "Text2SQLEnv", "generate_rows"]
