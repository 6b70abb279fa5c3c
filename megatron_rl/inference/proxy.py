"""The router served over HTTP (aiohttp): an OpenAI-compatible endpoint in front of the vLLM replicas.
``megatron-rl serve`` starts it; a Slurm recipe may run it alone:

    python -m megatron_rl.inference.proxy --port 8000 --policy sticky_least_loaded URL [URL ...]

Requests to vLLM's client routes (completions, chat completions, tokenize/detokenize, models) are
forwarded byte for byte; answers come back with the replica's status code and body, streamed
answers (server-sent events) chunk by chunk. A session stays on one replica, keyed by the
``X-Session-Id`` header or else the request's ``user`` field. A replica that cannot be reached or
answers 5xx is taken out of rotation and the request tried on another; once a stream has started it
cannot move, so a replica lost mid-stream ends the stream with an error event the client raises.
``X-Replica`` on every answer names the replica that served it.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import aiohttp
from aiohttp import web

from megatron_rl.inference.auth import auth_header
from megatron_rl.inference.config import POLICIES, RouterConfig
from megatron_rl.inference.protocol import SESSION_HEADER
from megatron_rl.inference.replica import KEEPALIVE_S, Replica
from megatron_rl.inference.router import Router

REPLICA_HEADER = "X-Replica"
FORWARDED_POSTS = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
_ROUTER = web.AppKey("router", Router)
_SECRET = web.AppKey("secret", bool)
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


def make_app(server_urls: list[str], config: RouterConfig, secret: str | None = None) -> web.Application:
    """An aiohttp app forwarding vLLM's client routes over ``server_urls``; with the run ``secret`` of managed
    servers it authenticates to them itself (the router is then the only way in)."""
    app = web.Application(client_max_size=64 << 20)

    async def open_router(app: web.Application):
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
                                     headers=auth_header(secret), auto_decompress=False)
        router = Router([Replica(url, http) for url in server_urls], config)
        router.start()
        app[_ROUTER] = router
        yield
        await router.stop()
        await http.close()

    app[_SECRET] = bool(secret)
    app.cleanup_ctx.append(open_router)
    for path in FORWARDED_POSTS:
        app.router.add_post(path, _forward)
    app.router.add_get("/v1/models", _forward)
    app.router.add_get("/health", _health)
    return app


def openai_error(status: int, message: str, kind: str) -> dict:
    """An error body in the OpenAI shape, which the ``openai`` client turns into its exceptions."""
    return {"error": {"message": message, "type": kind, "code": status}}


def session_key(headers, raw: bytes) -> str | None:
    """The session a request belongs to: the ``X-Session-Id`` header, else the body's ``user`` field."""
    if SESSION_HEADER in headers:
        return headers[SESSION_HEADER]
    if b'"user"' not in raw:  # skip parsing the bodies of clients that never send one
        return None
    try:
        user = json.loads(raw).get("user")
    except (ValueError, AttributeError):
        return None
    return str(user) if user else None


async def _forward(request: web.Request) -> web.StreamResponse:
    """Send the request to the policy's replica, failing over while no replica has answered (transport
    errors, 5xx); errors of the client's own connection never count against a replica."""
    router = request.app[_ROUTER]
    raw = await request.read()
    session = session_key(request.headers, raw)
    # with the run secret the router authenticates itself and drops the client's Authorization
    forwarded = ("content-type", "accept") if request.app[_SECRET] else ("content-type", "accept", "authorization")
    headers = {k: v for k, v in request.headers.items() if k.lower() in forwarded}
    if session:
        headers[SESSION_HEADER] = session
    timeout = aiohttp.ClientTimeout(total=router.config.request_timeout_s)
    tried: list[Replica] = []
    last: web.Response | None = None
    while (replica := router.next_replica(session, tried)) is not None:
        tried.append(replica)
        replica.in_flight += 1
        replica.assigned += 1
        try:
            try:
                upstream = await replica.http.request(request.method, replica.url + request.path_qs, data=raw or None,
                                                      headers=headers, timeout=timeout)
            except _UPSTREAM_ERRORS as err:
                replica.stats.failures += 1
                router.take_out(replica, f"{type(err).__name__}: {err}")
                continue
            async with upstream:
                if upstream.status < 500:
                    return await _relay(request, upstream, replica, router)
                last = await _read_whole(upstream, replica, router)
                router.take_out(replica, f"HTTP {upstream.status}")
        finally:
            replica.in_flight -= 1
    if last is not None:
        return last
    message = f"no replica answered {request.path} after {len(tried)} attempt(s)"
    return web.json_response(openai_error(503, message, "no_replica"), status=503)


async def _relay(request: web.Request, upstream: aiohttp.ClientResponse, replica: Replica, router: Router) -> web.StreamResponse:
    """The replica's answer, unchanged: status, content type and body; an event stream chunk by chunk."""
    if upstream.content_type != "text/event-stream":
        return await _read_whole(upstream, replica, router)
    response = web.StreamResponse(status=upstream.status, headers={
        "Content-Type": upstream.headers.get("Content-Type", "text/event-stream"), REPLICA_HEADER: replica.url})
    await response.prepare(request)
    chunks = upstream.content.iter_any()
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except _UPSTREAM_ERRORS as err:
            router.take_out(replica, f"lost mid-stream: {type(err).__name__}: {err}")
            message = f"replica {replica.url} was lost mid-stream ({type(err).__name__}); the answer is incomplete"
            await response.write(f"data: {json.dumps(openai_error(502, message, 'upstream_lost'))}\n\n".encode())
            break
        await response.write(chunk)
    await response.write_eof()
    return response


async def _read_whole(upstream: aiohttp.ClientResponse, replica: Replica, router: Router) -> web.Response:
    """A whole (non-streamed) answer as the replica sent it; 502 when the replica is lost while sending it."""
    try:
        body = await upstream.read()
    except _UPSTREAM_ERRORS as err:
        router.take_out(replica, f"lost while answering: {type(err).__name__}: {err}")
        message = f"replica {replica.url} was lost while answering ({type(err).__name__})"
        return web.json_response(openai_error(502, message, "upstream_lost"), status=502)
    return web.Response(status=upstream.status, body=body, content_type=upstream.content_type,
                        headers={REPLICA_HEADER: replica.url})


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
