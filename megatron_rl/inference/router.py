"""The data plane: one entry that places each request on a replica, retries failures elsewhere and
takes failing replicas out of rotation until their health check passes again."""

from __future__ import annotations

import asyncio
import logging

from megatron_rl.inference.config import RouterConfig
from megatron_rl.inference.policies import make_policy
from megatron_rl.inference.protocol import COMPLETIONS_PATH, SESSION_HEADER
from megatron_rl.inference.replica import Replica, ReplicaError

log = logging.getLogger(__name__)


class NoReplicaError(RuntimeError):
    """Every attempt failed or no replica is in rotation."""


class Router:
    """Routes completions over ``replicas`` with the configured policy; shared by client and proxy."""

    def __init__(self, replicas: list[Replica], config: RouterConfig):
        if not replicas:
            raise ValueError("inference: the router needs at least one replica URL")
        self.replicas = replicas
        self.config = config
        self.policy = make_policy(config.policy)
        self._health_task: asyncio.Task | None = None

    def start(self) -> None:
        """Start the background probe that puts recovered replicas back in rotation."""
        if self._health_task is None:
            self._health_task = asyncio.create_task(self._probe_loop())

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
            self._health_task = None

    async def send(self, payload: dict, session_id: str | None,
                   path: str = COMPLETIONS_PATH) -> tuple[dict, Replica, int, float]:
        """POST a generation request to ``path``; returns (body, replica that answered, attempts, latency)."""
        headers = {SESSION_HEADER: session_id} if session_id else {}
        tried: list[Replica] = []
        errors: list[str] = []
        await self._back_in_rotation()  # none in rotation when the request came: wait for one
        while (replica := self.next_replica(session_id, tried)) is not None:
            tried.append(replica)
            try:
                body, latency = await replica.complete(payload, headers, self.config.request_timeout_s, path)
                return body, replica, len(tried), latency
            except ReplicaError as err:
                errors.append(str(err))
                self.take_out(replica, err)
        raise NoReplicaError(f"no replica completed the request after {len(tried)} attempt(s): {errors}")

    def next_replica(self, session_id: str | None, tried: list[Replica]) -> Replica | None:
        """The policy's pick among healthy replicas not yet ``tried``; None when attempts or replicas run out."""
        candidates = [r for r in self.replicas if r.healthy and r not in tried]
        if not candidates or len(tried) >= self.config.max_attempts:
            return None
        return self.policy.choose(candidates, session_id)

    async def _back_in_rotation(self) -> None:
        """While no replica is in rotation, wait up to ``rotation_wait_s`` for a probe to return one (not when
        every replica is quarantined). A replica's failed probes while it loads new weights on a
        busy CPU took it out for ~30 s, and requests sent then failed the run with 0 attempts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.rotation_wait_s
        while not any(r.healthy for r in self.replicas):
            if all(r.quarantined for r in self.replicas) or loop.time() >= deadline:
                return
            await asyncio.sleep(min(self.config.health_interval_s, max(deadline - loop.time(), 0.0)))

    def quarantine(self, url: str, reason: str) -> None:
        """Take the replica at ``url`` out for good (its weights are not the fleet's): probes never return it."""
        for replica in self.replicas:
            if replica.url.rstrip("/") == url.rstrip("/"):
                log.error("inference: quarantining %s: %s", replica.url, reason)
                replica.quarantined = True
                self.take_out(replica, reason)

    def take_out(self, replica: Replica, reason: object) -> None:
        """Stop routing to ``replica`` until a health probe passes."""
        if replica.healthy:
            log.warning("inference: taking %s out of rotation: %s", replica.url, reason)
        replica.healthy = False
        replica.capturing_routes = False  # a restarted server comes back without hooks

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await self.probe()

    async def probe(self) -> None:
        """Check every replica once: one failing ``health_failures`` probes in a row leaves rotation, one that
        passes returns (a quarantined one never does)."""
        results = await asyncio.gather(*(r.is_healthy() for r in self.replicas))
        for replica, ok in zip(self.replicas, results):
            replica.failed_probes = 0 if ok else replica.failed_probes + 1
            if replica.quarantined:
                continue
            if ok and not replica.healthy:
                log.warning("inference: %s is healthy again, back in rotation", replica.url)
                replica.healthy = True
            elif replica.failed_probes >= self.config.health_failures:
                self.take_out(replica, f"{replica.failed_probes} health checks failed in a row")
