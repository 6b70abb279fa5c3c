"""The run's secret on managed vLLM servers: every route but ``/health`` needs ``Authorization: Bearer <secret>``.

vLLM's own ``--api-key`` guards only the ``/v1`` routes; the dev-mode control routes (``/collective_rpc``,
``/pause``, ``/resume``, the weight-transfer stages through ``/collective_rpc``) stay open to anyone who
reaches the server's address. This ASGI middleware, loaded with ``--middleware``, guards them all. The
secret reaches the server process in its environment (``MEGATRON_RL_RUN_SECRET``), never on its command
line, and is compared in constant time.
"""

from __future__ import annotations

import hmac
import json
import secrets

from megatron_rl.env_vars import RUN_SECRET, run_secret

OPEN_PATHS = ("/health",)
"""Routes a load balancer or a liveness probe reads without the secret; they reveal nothing."""


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def auth_header(secret: str | None) -> dict[str, str]:
    """The header a client sends with every request (none when the run has no secret)."""
    return {"Authorization": f"Bearer {secret}"} if secret else {}


class RequireRunSecret:
    """ASGI middleware (vLLM adds it with ``app.add_middleware``): 401 for HTTP requests without the secret
    (websockets are closed)."""

    def __init__(self, app):
        self.app = app
        secret = run_secret()
        if not secret:
            raise RuntimeError(f"{RUN_SECRET} is not set: the server would refuse every request")
        self.expected = f"Bearer {secret}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS or self._authorized(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"error": "missing or wrong run secret (Authorization: Bearer ...)"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope) -> bool:
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)
