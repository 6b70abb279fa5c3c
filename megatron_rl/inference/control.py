"""The control plane: one call fans out to every replica in rotation through vLLM's dev-mode routes.

Native routes of the pinned vLLM (``VLLM_SERVER_DEV_MODE=1``): ``/pause?mode=keep|abort|wait``,
``/resume``, ``/is_paused``, ``/abort_requests``, ``/reset_prefix_cache``,
``/update_weight_version``, ``/weight_info``, ``/collective_rpc``, ``/server_info``, ``/sleep``,
``/wake_up``. On the CPU build ``/sleep`` and ``/wake_up`` answer 200 and do nothing, so
``sleep``/``wake_up`` here refuse on CPU replicas instead of pretending.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from megatron_rl.inference.replica import Replica, RouteNotFound

PauseMode = Literal["keep", "abort", "wait"]


class UnsupportedOnPlatform(RuntimeError):
    """The operation has no real effect on this replica's platform (e.g. sleep on vLLM CPU)."""


class ControlPlane:
    """Fan-out control over ``replicas``; replicas out of rotation are skipped (they rejoin synced)."""

    def __init__(self, replicas: list[Replica], timeout_s: float = 600.0):
        self.replicas = replicas
        self.timeout_s = timeout_s

    def _targets(self) -> list[Replica]:
        return [r for r in self.replicas if r.healthy]

    async def _each(self, call) -> dict[str, object]:
        targets = self._targets()
        results = await asyncio.gather(*(call(r) for r in targets))
        return {r.url: res for r, res in zip(targets, results)}

    async def pause(self, mode: PauseMode = "keep") -> None:
        """keep: freeze in-flight requests (vLLM's pause also drops the KV and prefix caches, so they resume by
        recomputing their KV, under the weights loaded meanwhile); abort: end them now with partial outputs
        (finish reason abort); wait: return once they have all finished. New requests queue."""
        if mode not in ("keep", "abort", "wait"):
            raise ValueError(f"pause mode {mode!r}: use keep, abort or wait")
        await self._each(lambda r: r.post("/pause", params={"mode": mode}, timeout_s=self.timeout_s))

    async def resume(self) -> None:
        await self._each(lambda r: r.post("/resume", timeout_s=self.timeout_s))

    async def is_paused(self) -> dict[str, bool]:
        return {url: body["is_paused"] for url, body in (await self._each(lambda r: r.get("/is_paused"))).items()}

    async def abort_all(self) -> None:
        """Abort every in-flight request without pausing."""
        await self._each(lambda r: r.post("/abort_requests", {}, timeout_s=self.timeout_s))

    async def reset_prefix_cache(self) -> None:
        await self._each(lambda r: r.post("/reset_prefix_cache", timeout_s=self.timeout_s))

    async def set_weight_version(self, version: str) -> None:
        """Record ``version`` on every replica: vLLM's ``/update_weight_version``, or the worker extension's tag
        on servers without that route (vLLM 0.26, the CUDA release for torch 2.11)."""
        async def tag(r: Replica) -> None:
            try:
                await r.post("/update_weight_version", {"new_version": version})
            except RouteNotFound:
                await r.post("/collective_rpc", {"method": "mrl_set_weight_version", "args": [version]})
        await self._each(tag)

    async def weight_versions(self) -> dict[str, str | None]:
        """The weight version each replica reports (vLLM's ``/weight_info``, else the worker extension's tag)."""
        async def read(r: Replica) -> str | None:
            try:
                return (await r.get("/weight_info"))["weight_version"]
            except RouteNotFound:
                return (await r.post("/collective_rpc", {"method": "mrl_weight_version"}))["results"][0]
        return await self._each(read)

    async def health(self) -> dict[str, bool]:
        """Health of every replica, in rotation or not."""
        results = await asyncio.gather(*(r.is_healthy() for r in self.replicas))
        return {r.url: ok for r, ok in zip(self.replicas, results)}

    async def collective_rpc(self, method: str, args: list[str] | None = None,
                             kwargs: dict[str, str] | None = None) -> dict[str, list]:
        """Call ``method`` on every worker of every replica (worker extension methods included);
        arguments travel as strings. Returns each replica's per-worker results."""
        body = {"method": method, "args": args or [], "kwargs": kwargs or {}}
        answers = await self._each(lambda r: r.post("/collective_rpc", body, timeout_s=self.timeout_s))
        return {url: a.get("results", []) for url, a in answers.items()}

    async def devices(self) -> dict[str, str]:
        """Each replica's device type (cpu, cuda, ...) from ``/server_info``."""
        infos = await self._each(lambda r: r.get("/server_info", params={"config_format": "json"}))
        return {url: info["vllm_config"]["device_config"]["device"] for url, info in infos.items()}

    async def sleep(self, level: int = 1) -> None:
        """Release weights (level 2) or offload them (level 1) and the KV cache; GPU replicas only."""
        await self._require_sleep_support()
        await self._each(lambda r: r.post("/sleep", params={"level": str(level)}, timeout_s=self.timeout_s))

    async def wake_up(self) -> None:
        await self._require_sleep_support()
        await self._each(lambda r: r.post("/wake_up", timeout_s=self.timeout_s))

    async def _require_sleep_support(self) -> None:
        cpu = [url for url, device in (await self.devices()).items() if device == "cpu"]
        if cpu:
            raise UnsupportedOnPlatform(
                f"sleep/wake_up: vLLM's CPU build accepts /sleep and /wake_up but frees nothing; "
                f"refusing on CPU replicas {cpu}. Keep CPU replicas awake (pause/resume still work)."
            )
