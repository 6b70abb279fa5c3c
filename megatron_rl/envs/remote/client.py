"""``remote``: an env that plays its episode on an env server (``serve-envs``) over one WebSocket.

Row extras: ``url`` (``http://host:port``), ``env_class`` (the server's env), ``env_extras`` (its extras),
optionally ``token_env`` (the name of the environment variable holding the token, read where the generator
runs) and ``tools`` (the tool names the row's prompt offers; the server's env must offer exactly these).

Failures: a server that refuses, goes away or passes a call's deadline raises ``EnvError`` (the generator
replays the rollout as a fresh sample); a reset keeps retrying the connection until ``reset_deadline_s`` (a
restarting server); an unscored episode or a tool list that differs from the server's raises ``TaskBug``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from megatron_rl.env_vars import secret
from megatron_rl.envs.base import Env, EnvError, StepResult, TaskBug
from megatron_rl.envs.registry import register_env
from megatron_rl.envs.remote import protocol as P
from megatron_rl.envs.tool_calls import PARSERS, parse_tool_calls


@dataclass
class RemoteConfig:
    """``envs.remote.*``: deadlines of the network calls."""

    reset_deadline_s: float = 120.0
    """Seconds a reset keeps retrying a server that refuses connections (restarting); none starts after it."""
    call_timeout_s: float = 60.0
    """Seconds one reset or step may take once connected (including a wait for a free server slot)."""
    retry_interval_s: float = 1.0
    """Pause between connection attempts during a reset."""
    tool_call_format: str = "hermes"
    """Tool-call syntax counted in ``tool_calls`` / ``unparsed_calls`` metrics (hermes or qwen3_coder)."""

    def __post_init__(self) -> None:
        for key in ("reset_deadline_s", "call_timeout_s", "retry_interval_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"envs.remote.{key}: must be > 0, got {getattr(self, key)}")
        if self.tool_call_format not in PARSERS:
            raise ValueError(f"envs.remote.tool_call_format: '{self.tool_call_format}'; known: {', '.join(PARSERS)}")


_CLOSING: set[asyncio.Task] = set()
"""Background closes in flight (held so that they are not garbage-collected mid-way)."""


def _headers(extras: dict) -> dict:
    name = extras.get("token_env")
    if not name:
        return {}
    token = secret(name)
    if token is None:
        raise TaskBug(f"remote env: environment variable {name} (env_extras.token_env) is not set where the "
                      "generator runs; export it on every node")
    return {"Authorization": f"Bearer {token}"}


def ws_url(url: str) -> str:
    """The session socket's URL for a server URL given as http(s):// or ws(s)://."""
    base = url.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return base + P.SESSION_PATH


@register_env
class RemoteEnv(Env):
    """One episode on a remote env server; ``init`` and ``step`` are coroutines with their own deadlines."""

    name = "remote"
    Config = RemoteConfig
    required_extras = ("url", "env_class")

    def __init__(self, extras: dict, config=None):
        super().__init__(extras, config)
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self.metrics = {"tool_calls": 0.0, "unparsed_calls": 0.0}

    async def _connect(self) -> None:
        deadline = time.monotonic() + self.config.reset_deadline_s
        headers = _headers(self.extras)
        self._http = aiohttp.ClientSession()
        while True:
            try:
                self._ws = await self._http.ws_connect(ws_url(self.extras["url"]), headers=headers,
                                                       timeout=aiohttp.ClientWSTimeout(ws_close=5), heartbeat=None)
                return
            except aiohttp.WSServerHandshakeError as err:
                if err.status in (401, 403):
                    raise TaskBug(f"remote env {self.extras['url']}: token refused (HTTP {err.status}); check "
                                  f"env_extras.token_env ({self.extras.get('token_env')})") from None
                failure = f"handshake HTTP {err.status}"
            except (aiohttp.ClientConnectionError, OSError) as err:
                failure = f"{type(err).__name__}: {err}"
            if time.monotonic() + self.config.retry_interval_s > deadline:
                raise EnvError(f"remote env {self.extras['url']}: no session within envs.remote.reset_deadline_s="
                               f"{self.config.reset_deadline_s} ({failure})")
            await asyncio.sleep(self.config.retry_interval_s)

    async def _call(self, message: dict) -> dict:
        try:
            await self._ws.send_json(message)
            reply = await self._ws.receive(timeout=self.config.call_timeout_s)
        except asyncio.TimeoutError:
            raise EnvError(f"remote env: no reply within envs.remote.call_timeout_s={self.config.call_timeout_s}") from None
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as err:
            raise EnvError(f"remote env: connection lost ({type(err).__name__}: {err})") from None
        if reply.type != aiohttp.WSMsgType.TEXT:
            code = self._ws.close_code
            raise EnvError(f"remote env: session closed by the server (code {code}"
                           f"{', at its concurrency limit' if code == P.CLOSE_TRY_AGAIN else ''})")
        data = reply.json()
        if data.get("op") == "error":
            cls = TaskBug if data["kind"] in (P.TASK_BUG, P.BAD_REQUEST) else EnvError
            raise cls(f"remote env {self.extras['env_class']}: {data['message']}")
        return data

    async def init(self, prompt: list[dict]) -> tuple[list[dict], dict]:
        await self._connect()
        ready = await self._call({"op": "reset", "env_class": self.extras["env_class"], "prompt": prompt,
                                  "extras": self.extras.get("env_extras", {}), "config": self.extras.get("config")})
        listed = self.extras.get("tools")
        if listed is not None and sorted(listed) != sorted(ready["tools"]):
            raise TaskBug(f"remote env {self.extras['env_class']}: the row lists tools {sorted(listed)} but the server's "
                          f"env offers {sorted(ready['tools'])}; rewrite the rows (megatron-rl write-rows)")
        return ready["prompt"], {}

    async def step(self, action: str) -> StepResult:
        parsed = parse_tool_calls(action, self.config.tool_call_format)
        self.metrics["tool_calls"] += len(parsed.calls)
        self.metrics["unparsed_calls"] += float(parsed.error is not None)
        data = await self._call({"op": "step", "action": action})
        self.metrics.update({k: float(v) for k, v in data.get("metrics", {}).items()})
        result = StepResult(data["observations"], data["reward"], data["done"], data.get("metadata", {}))
        if result.done:
            await self._finish()
        return result

    async def _finish(self) -> None:
        if self._ws is not None and not self._ws.closed:
            try:
                await self._ws.send_json({"op": "close"})
                await self._ws.close()
            except (aiohttp.ClientError, ConnectionError, RuntimeError):
                pass
        if self._http is not None:
            await self._http.close()
        self._ws = self._http = None

    def close(self) -> None:
        """Ends a session the episode left open (an error or a cut-off episode), in the background."""
        if self._http is None:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._finish())
        except RuntimeError:  # no loop running: close here
            asyncio.run(self._finish())
            return
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)

    @classmethod
    def reference_reply(cls, extras: dict) -> str:
        """The served env's reference reply when that env is also installed here (SFT warm starts)."""
        from megatron_rl.envs.registry import get_env_class

        return get_env_class(extras["env_class"]).reference_reply(extras.get("env_extras", {}))
