"""Live episodes on the server: at most ``max_concurrent`` at once; a new one waits (bounded) for a free slot."""

from __future__ import annotations

import asyncio
import itertools

from megatron_rl.envs.base import Env


class AtCapacity(RuntimeError):
    """No slot freed within the bounded wait."""


class Sessions:
    """Counts and holds every open episode's env, so that shutdown can close them all."""

    def __init__(self, max_concurrent: int, max_wait_s: float):
        if max_concurrent < 1 or max_wait_s < 0:
            raise ValueError(f"serve-envs: --max-concurrent must be >= 1 and --max-wait-s >= 0, "
                             f"got {max_concurrent} and {max_wait_s}")
        self.max_concurrent, self.max_wait_s = max_concurrent, max_wait_s
        self._slots = asyncio.Semaphore(max_concurrent)
        self._ids = itertools.count()
        self.envs: dict[int, Env] = {}
        self.active: set[int] = set()
        self.waiting = 0
        self.served = 0

    async def acquire(self) -> int:
        """A session id holding one slot; AtCapacity after ``max_wait_s`` at the limit."""
        self.waiting += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), self.max_wait_s)
        except asyncio.TimeoutError:
            raise AtCapacity(f"{self.max_concurrent} episodes running; none ended within {self.max_wait_s}s") from None
        finally:
            self.waiting -= 1
        sid = next(self._ids)
        self.active.add(sid)
        return sid

    def attach(self, sid: int, env: Env) -> None:
        self.envs[sid] = env

    def release(self, sid: int) -> None:
        """Close the session's env (if any) and free its slot."""
        env = self.envs.pop(sid, None)
        if env is not None:
            env.close()
        if sid in self.active:
            self.active.discard(sid)
            self.served += 1
            self._slots.release()

    def close_all(self) -> int:
        """Close every env still open; returns how many."""
        for env in list(self.envs.values()):
            env.close()
        count, _ = len(self.envs), self.envs.clear()
        return count

    def stats(self) -> dict:
        return {"sessions": len(self.active), "waiting": self.waiting, "served": self.served,
                "max_concurrent": self.max_concurrent}
