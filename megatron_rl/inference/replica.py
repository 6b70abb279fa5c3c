"""One vLLM server as the router sees it: its URL, load, health and HTTP calls."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from megatron_rl.inference.metrics import ReplicaStats, prefix_cache_counters
from megatron_rl.inference.protocol import COMPLETIONS_PATH


# vLLM's server (uvicorn) closes idle keep-alive connections after 5 s; reusing one it already closed
# fails as "server disconnected" and would take a healthy replica out. Drop ours first.
KEEPALIVE_S = 3.0

class ReplicaError(RuntimeError):
    """A replica failed a request (connection lost, timeout, server error): retry elsewhere."""


class RouteNotFound(ValueError):
    """The server has no such route (HTTP 404): an older or newer vLLM than the caller expects."""


class Replica:
    """Client for one server. ``in_flight`` and ``assigned`` are what routing policies read."""

    def __init__(self, url: str, http: aiohttp.ClientSession):
        self.url = url.rstrip("/")
        self.http = http
        self.in_flight = 0
        self.assigned = 0
        self.healthy = True
        self.quarantined = False
        self.failed_probes = 0
        """Set when its weights failed to update: it never serves again in this run."""
        self.capturing_routes = False
        self.stats = ReplicaStats()

    def __repr__(self) -> str:
        return f"Replica({self.url}, in_flight={self.in_flight}, healthy={self.healthy})"

    async def post(self, path: str, body: dict | None = None, params: dict | None = None,
                   headers: dict | None = None, timeout_s: float = 60.0) -> dict:
        """POST and return the JSON answer ({} when empty); ReplicaError on any transport or 5xx failure."""
        return await self._call("POST", path, body, params, headers, timeout_s)

    async def get(self, path: str, params: dict | None = None, timeout_s: float = 10.0) -> dict:
        return await self._call("GET", path, None, params, None, timeout_s)

    async def _call(self, method, path, body, params, headers, timeout_s) -> dict:
        try:
            async with self.http.request(method, self.url + path, json=body, params=params, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                text = await resp.text()
                if resp.status >= 500:
                    raise ReplicaError(f"{self.url}{path}: HTTP {resp.status}: {text[:500]}")
                if resp.status == 404:
                    raise RouteNotFound(f"{self.url}{path}: HTTP 404: {text[:500]}")
                if resp.status >= 400:
                    raise ValueError(f"{self.url}{path}: HTTP {resp.status}: {text[:500]}")
                if resp.content_type == "application/json":
                    return await resp.json()
                return {"text": text} if text else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as err:
            raise ReplicaError(f"{self.url}{path}: {type(err).__name__}: {err}") from err

    async def complete(self, payload: dict, headers: dict, timeout_s: float,
                       path: str = COMPLETIONS_PATH) -> tuple[dict, float]:
        """Run one generation request at ``path``, counting it in flight; returns the body and its latency."""
        self.in_flight += 1
        self.assigned += 1
        start = time.monotonic()
        try:
            body = await self.post(path, payload, headers=headers, timeout_s=timeout_s)
        except ReplicaError:
            self.stats.failures += 1
            raise
        finally:
            self.in_flight -= 1
        latency = time.monotonic() - start
        self.stats.record(latency, body.get("usage", {}).get("completion_tokens", 0))
        return body, latency

    async def is_healthy(self) -> bool:
        """Whether ``/health`` answers 200 within a few seconds."""
        try:
            await self.get("/health", timeout_s=5.0)
            return True
        except (ReplicaError, ValueError):
            return False

    async def metrics(self) -> dict[str, float]:
        """Client-side stats plus the server's prefix-cache counters when it reports them."""
        out = {"in_flight": self.in_flight, "healthy": float(self.healthy), **self.stats.snapshot()}
        if self.healthy:
            try:
                counters = prefix_cache_counters((await self.get("/metrics")).get("text", ""))
            except (ReplicaError, ValueError):
                counters = None
            if counters:
                out["prefix_cache_hits"], out["prefix_cache_queries"] = counters
                out["prefix_cache_hit_rate"] = counters[0] / counters[1] if counters[1] else 0.0
        return out
