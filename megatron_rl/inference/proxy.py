"""The router served over HTTP (aiohttp) for users outside our process, e.g. a Slurm recipe:

    python -m megatron_rl.inference.proxy --port 8000 --policy sticky_least_loaded URL [URL ...]

It speaks vLLM's ``/v1/completions`` (session id in the ``X-Session-Id`` header), answers which
replica served a request in ``X-Replica``, and shares its routing code with the in-process client.
"""

from __future__ import annotations

import argparse
import json

import aiohttp
from aiohttp import web

from megatron_rl.inference.config import POLICIES, RouterConfig
from megatron_rl.inference.protocol import SESSION_HEADER
from megatron_rl.inference.replica import KEEPALIVE_S, Replica
from megatron_rl.inference.router import NoReplicaError, Router

REPLICA_HEADER = "X-Replica"
_ROUTER = web.AppKey("router", Router)


def make_app(server_urls: list[str], config: RouterConfig) -> web.Application:
    """An aiohttp app routing ``/v1/completions`` over ``server_urls``."""
    app = web.Application(client_max_size=64 << 20)

    async def open_router(app: web.Application):
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S))
        router = Router([Replica(url, http) for url in server_urls], config)
        router.start()
        app[_ROUTER] = router
        yield
        await router.stop()
        await http.close()

    app.cleanup_ctx.append(open_router)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    return app


async def _completions(request: web.Request) -> web.Response:
    router = request.app[_ROUTER]
    payload = await request.json()
    try:
        body, replica, _, _ = await router.send(payload, request.headers.get(SESSION_HEADER))
    except NoReplicaError as err:
        return web.json_response({"error": str(err)}, status=503)
    except ValueError as err:
        return web.json_response({"error": str(err)}, status=400)
    return web.json_response(body, headers={REPLICA_HEADER: replica.url}, dumps=json.dumps)


async def _models(request: web.Request) -> web.Response:
    router = request.app[_ROUTER]
    replica = next((r for r in router.replicas if r.healthy), None)
    if replica is None:
        return web.json_response({"error": "no replica in rotation"}, status=503)
    return web.json_response(await replica.get("/v1/models"))


async def _health(request: web.Request) -> web.Response:
    healthy = any(r.healthy for r in request.app[_ROUTER].replicas)
    return web.Response(status=200 if healthy else 503)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server_urls", nargs="+", help="vLLM server URLs behind the proxy")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--policy", default="sticky_least_loaded", choices=POLICIES)
    parser.add_argument("--max-attempts", type=int, default=3)
    args = parser.parse_args(argv)
    config = RouterConfig(policy=args.policy, max_attempts=args.max_attempts)
    web.run_app(make_app(args.server_urls, config), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
