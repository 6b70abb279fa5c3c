"""Environments: the protocol, the registry by name, tool-call parsing and the built-ins.

Built-ins (registered on import): ``arithmetic``, ``math``, ``text2sql``, ``gridsim``, and ``remote`` (an env
played on an env server, ``envs/remote/``).
"""

from megatron_rl.envs.base import Env, EnvError, StepResult, TaskBug
from megatron_rl.envs.registry import env_names, env_tools, get_env_class, make_env, register_env
from megatron_rl.envs.tool_calls import ParsedReply, ToolCall, parse_tool_calls

from megatron_rl.envs import arithmetic, gridsim, math_problems, remote, text2sql  # noqa: E402,F401  (registration)

__all__ = ["Env", "EnvError", "ParsedReply", "StepResult", "TaskBug", "ToolCall", "env_names", "env_tools",
           "get_env_class", "make_env", "parse_tool_calls", "register_env"]
