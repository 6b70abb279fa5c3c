"""``megatron-rl serve-envs``: a FastAPI app on uvicorn serving a bundle's envs, one WebSocket session per episode.

``/health`` is open; ``/envs``, ``/tasks`` and the session socket need the bearer token when one is set
(compared in constant time). SIGTERM: uvicorn stops accepting, closes open sockets (1012) and every running
episode's env is closed; clients replay those rollouts once the server is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from megatron_rl.envs.base import TaskBug
from megatron_rl.envs.registry import env_names, get_env_class, make_env
from megatron_rl.envs.remote import protocol as P
from megatron_rl.envs.remote.auth import check_bearer
from megatron_rl.envs.remote.bundle import bundle_tasks, load_bundle
from megatron_rl.envs.remote.sessions import AtCapacity, Sessions

log = logging.getLogger("megatron_rl.envs.server")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServerConfig:
    """What ``serve-envs`` serves and how."""

    bundle: str
    """Module, ``.py`` file or folder registering envs (and tasks); ``builtin`` for the built-ins only."""
    host: str = "127.0.0.1"
    """Address to bind; plain HTTP off loopback prints a warning."""
    port: int = 8765
    """Port to bind (0 picks a free one)."""
    token: str | None = None
    """Bearer token every route but /health needs; None leaves the server open."""
    max_concurrent: int = 64
    """Episodes running at once; more wait for a slot."""
    max_wait_s: float = 60.0
    """Seconds a new episode waits for a slot before it is refused (close code 1013)."""
    idle_timeout_s: float = 600.0
    """Seconds a session may stay silent before the server ends it (a client that vanished)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"serve-envs --port: {self.port} is not a port")
        if self.idle_timeout_s <= 0:
            raise ValueError(f"serve-envs --idle-timeout-s: must be > 0, got {self.idle_timeout_s}")


def create_app(cfg: ServerConfig) -> FastAPI:
    bundle = load_bundle(cfg.bundle)
    sessions = Sessions(cfg.max_concurrent, cfg.max_wait_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        # env calls run in threads: one per slot (the default pool has only cpu_count + 4)
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=cfg.max_concurrent, thread_name_prefix="env"))
        yield
        open_ = sessions.close_all()  # episodes still open when the server stops
        log.info("serve-envs: stopped; %d episodes served, %d still open were closed", sessions.served, open_)

    app = FastAPI(title="megatron-rl envs", lifespan=lifespan)
    app.state.sessions = sessions

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        status = None if request.url.path == P.HEALTH_PATH else check_bearer(request.headers.get("authorization"), cfg.token)
        if status is not None:
            return JSONResponse({"detail": "missing bearer token" if status == 401 else "wrong token"}, status_code=status,
                                headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.get(P.HEALTH_PATH)
    def health() -> dict:
        return {"status": "ok", **sessions.stats()}

    @app.get(P.ENVS_PATH)
    def envs() -> dict:
        return {name: {"tools": get_env_class(name).tools, "required_extras": list(get_env_class(name).required_extras)}
                for name in env_names()}

    @app.get(P.TASKS_PATH)
    def tasks(split: str | None = None) -> list[dict]:
        return bundle_tasks(bundle, split)

    @app.websocket(P.SESSION_PATH)
    async def session(ws: WebSocket) -> None:
        if check_bearer(ws.headers.get("authorization"), cfg.token) is not None:
            await ws.close(code=P.CLOSE_POLICY)  # before accept: the handshake is refused with HTTP 403
            return
        await ws.accept()
        await _episode(ws, sessions, cfg.idle_timeout_s)

    return app


async def _receive(ws: WebSocket, timeout: float) -> dict:
    return await asyncio.wait_for(ws.receive_json(), timeout)


async def _episode(ws: WebSocket, sessions: Sessions, idle_s: float) -> None:
    """reset → step … → close; every exit closes the env and frees the slot."""
    sid = None
    try:
        reset = await _receive(ws, idle_s)
        sid = await sessions.acquire()
        env = await asyncio.to_thread(make_env, reset["env_class"], reset.get("extras", {}), reset.get("config"))
        sessions.attach(sid, env)
        prompt, _ = await asyncio.to_thread(env.init, reset["prompt"])
        await ws.send_json({"op": "ready", "prompt": prompt, "tools": [t["function"]["name"] for t in env.tools]})
        while True:
            msg = await _receive(ws, idle_s)
            if msg.get("op") != "step":
                break
            result = await asyncio.to_thread(env.step, msg["action"])
            await ws.send_json({"op": "result", **asdict(result), "metrics": env.metrics})
        await ws.close(code=P.CLOSE_NORMAL)
    except AtCapacity as err:
        await ws.close(code=P.CLOSE_TRY_AGAIN, reason=str(err)[:120])
    except (WebSocketDisconnect, asyncio.TimeoutError, asyncio.CancelledError):
        pass  # the client left, went silent, or the server is shutting down
    except TaskBug as err:
        await _error(ws, P.TASK_BUG, err)
    except (KeyError, ValueError, TypeError) as err:
        await _error(ws, P.BAD_REQUEST if sid is None or sid not in sessions.envs else P.ENV_ERROR, err)
    except Exception as err:  # the env's own failure: the client replays the rollout
        await _error(ws, P.ENV_ERROR, err)
    finally:
        if sid is not None:
            sessions.release(sid)


async def _error(ws: WebSocket, kind: str, err: Exception) -> None:
    log.warning("session %s: %s: %s", kind, type(err).__name__, err)
    try:
        await ws.send_json({"op": "error", "kind": kind, "message": f"{type(err).__name__}: {err}"})
        await ws.close(code=P.CLOSE_NORMAL)
    except Exception:  # the socket is already gone
        pass


def serve(cfg: ServerConfig) -> None:
    """Run the server until SIGTERM/SIGINT."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log.info("serve-envs: %s on http://%s:%d (token %s, at most %d episodes at once)", cfg.bundle, cfg.host, cfg.port,
             "required" if cfg.token else "off", cfg.max_concurrent)
    if cfg.host not in LOOPBACK:
        log.warning("serve-envs: plain HTTP on %s: tokens and episodes cross the network unencrypted; "
                    "put TLS in front (a reverse proxy) or bind to 127.0.0.1", cfg.host)
    if cfg.token is None:
        log.warning("serve-envs: no token configured: every route is open")
    uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_level="warning", timeout_graceful_shutdown=5,
                ws="websockets-sansio")
