"""Replica handles the loop passes in: RPC to every worker, pause/resume, health, quarantine.

``LLMReplica`` wraps an in-process ``vllm.LLM``; ``HTTPReplica`` a server started with
``VLLM_SERVER_DEV_MODE=1`` (routes ``/collective_rpc``, ``/pause``, ``/resume``, ``/health``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Protocol


class ReplicaDown(RuntimeError):
    """The replica did not answer (process gone, connection refused, timeout)."""


class Replica(Protocol):
    name: str

    def call(self, method: str, payload: dict, timeout_s: float) -> list[dict]:
        """Run a receiver method on every worker; one result per worker. ReplicaDown when unreachable."""

    def pause(self, mode: str) -> None: ...

    def resume(self) -> None: ...

    def healthy(self) -> bool: ...

    def quarantine(self, reason: str) -> None:
        """Take the replica out of serving for good (out of the router); it must not serve again."""


class LLMReplica:
    """An in-process ``vllm.LLM``: the offline engine only runs inside ``generate``, so pause and resume
    record state (``serving``) that the caller checks before generating."""

    def __init__(self, llm, name: str):
        self.llm, self.name = llm, name
        self.serving, self.quarantined = True, None

    def call(self, method: str, payload: dict, timeout_s: float) -> list[dict]:
        try:
            return self.llm.collective_rpc(method, timeout=timeout_s, args=(json.dumps(payload),))
        except Exception as err:  # the engine raises its own dead/timeout types
            raise ReplicaDown(f"{self.name}: {method}: {type(err).__name__}: {err}") from err

    def pause(self, mode: str) -> None:
        """Stop serving and drop the prefix cache, as the server's ``/pause`` does: blocks computed with
        the old weights must not be reused once the new ones are loaded."""
        self.serving = False
        self.llm.reset_prefix_cache()

    def resume(self) -> None:
        if self.quarantined is None:
            self.serving = True

    def healthy(self) -> bool:
        try:
            self.call("wt_describe", {}, timeout_s=30)
            return True
        except ReplicaDown:
            return False

    def quarantine(self, reason: str) -> None:
        self.serving, self.quarantined = False, reason


class HTTPReplica:
    """A vLLM OpenAI server in dev mode; ``on_quarantine(url, reason)`` takes it out of the loop's router."""

    def __init__(self, url: str, on_quarantine: Callable[[str, str], None] | None = None, headers: dict | None = None):
        self.url = self.name = url.rstrip("/")
        self.on_quarantine = on_quarantine
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        """Sent with every call (the run secret's ``Authorization`` where the servers check one)."""

    def _post(self, path: str, body: dict | None, timeout_s: float) -> dict:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(self.url + path, data=data, method="POST", headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            raise ReplicaDown(f"{self.url}{path}: {err}") from err
        return json.loads(text) if text else {}

    def call(self, method: str, payload: dict, timeout_s: float) -> list[dict]:
        body = {"method": method, "args": [json.dumps(payload)], "timeout": timeout_s}
        return self._post("/collective_rpc", body, timeout_s + 30)["results"]

    def pause(self, mode: str) -> None:
        self._post("/pause?" + urllib.parse.urlencode({"mode": mode}), None, 600)

    def resume(self) -> None:
        self._post("/resume", None, 60)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            return False

    def quarantine(self, reason: str) -> None:
        if self.on_quarantine is not None:
            self.on_quarantine(self.url, reason)
