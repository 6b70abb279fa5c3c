"""The run secret: the middleware refuses requests without it, and it never reaches a command line."""

import asyncio

import pytest

from megatron_rl.env_vars import RUN_SECRET
from megatron_rl.inference.auth import RequireRunSecret, auth_header
from megatron_rl.inference.config import ServerConfig
from megatron_rl.inference.server_process import server_command, server_env


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _status(middleware, path: str, headers: dict) -> int:
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(middleware(scope, None, send))
    return sent[0]["status"]


def test_every_route_but_health_needs_the_secret(monkeypatch):
    monkeypatch.setenv(RUN_SECRET, "s3cret")
    guard = RequireRunSecret(_app)
    for path in ("/collective_rpc", "/pause", "/resume", "/v1/completions", "/server_info"):
        assert _status(guard, path, {}) == 401
        assert _status(guard, path, {"Authorization": "Bearer wrong"}) == 401
        assert _status(guard, path, auth_header("s3cret")) == 200
    assert _status(guard, "/health", {}) == 200


def test_a_server_without_a_secret_would_refuse_everything_so_it_does_not_start(monkeypatch):
    monkeypatch.delenv(RUN_SECRET, raising=False)
    with pytest.raises(RuntimeError, match=RUN_SECRET):
        RequireRunSecret(_app)


def test_the_secret_travels_in_the_environment_not_on_the_command_line(tmp_path):
    config = ServerConfig(model_path="/m", run_dir=str(tmp_path))
    cmd = server_command(config, 1234, seed=0, host="10.0.0.2", guarded=True)
    env = server_env(config, 0, on_cpu=True, ipc_dir=str(tmp_path), secret="s3cret")
    assert not any("s3cret" in word for word in cmd)
    assert cmd[cmd.index("--middleware") + 1] == "megatron_rl.inference.auth.RequireRunSecret"
    assert cmd[cmd.index("--host") + 1] == "10.0.0.2"
    assert env[RUN_SECRET] == "s3cret"
