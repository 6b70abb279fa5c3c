"""Environments served over the network: ``serve-envs`` (server) and the ``remote`` env (client).

The server imports envs, never the loop; the client is an env like any other, whose rows carry the
server's URL and the name of the environment variable holding the token (never the token itself).
"""

from megatron_rl.envs.remote.client import RemoteConfig, RemoteEnv

__all__ = ["RemoteConfig", "RemoteEnv"]
