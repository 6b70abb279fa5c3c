"""Generation workers for the fully asynchronous schedule: groups start as admission allows and land
in a bounded buffer the trainer takes mini-batches from.

One producer task starts groups (one prompt, ``n_samples_per_prompt`` trajectories each) while the
admission controller has capacity; each group runs as its own task through the generator. A group
that failed every attempt, or whose rewards do not vary when ``algorithm.filters.zero_variance_filter``
is on, is filtered on completion and frees its place. Everything runs on the schedule's event loop;
one condition wakes producer and trainer on every change.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from megatron_rl.contracts import FAILED, GeneratorInput, GeneratorOutput, PromptItem
from megatron_rl.schedules.admission import AdmissionController
from megatron_rl.schedules.components import Components
from megatron_rl.schedules.dynamic_sampling import has_signal


@dataclass
class Group:
    """A completed group and the step it was scheduled at."""

    step: int
    item: PromptItem
    output: GeneratorOutput


class GroupPool:
    """``await pool.take(B)`` returns B useful groups, oldest first; producers run in the background."""

    def __init__(self, c: Components, admission: AdmissionController, requeue: list[PromptItem], version):
        self.c, self.admission, self.version = c, admission, version
        self.requeue = list(requeue)
        """Prompts drawn before a resume but neither trained nor filtered: generated first."""
        self.buffer: list[Group] = []
        self.pending: dict[str, PromptItem] = {}
        """Running or buffered groups by instance id (what a checkpoint must re-queue)."""
        self.filtered_ids: list[str] = []
        self.changed = asyncio.Condition()
        self.tasks: set[asyncio.Task] = set()
        self.failure: BaseException | None = None
        """The first generation task's exception (an inference or contract fault): the trainer re-raises it."""
        self.sampler_idle_s, self._idle_since = 0.0, time.perf_counter()
        self.producer = asyncio.create_task(self._produce())

    async def take(self, groups: int) -> list[Group]:
        """The oldest ``groups`` buffered groups that pass the hard lag cap (waits until there are enough)."""
        async with self.changed:
            while True:
                if self.failure is not None:
                    raise RuntimeError("fully_async: a generation task failed") from self.failure
                if self.producer.done():
                    self.producer.result()  # raises what stopped the producer
                too_old = [g for g in self.buffer if self.admission.over_lag_cap(g.step)]
                for g in too_old:
                    self._drop(g)
                if too_old:
                    self.changed.notify_all()
                if len(self.buffer) >= groups:
                    break
                await self.changed.wait()
            taken, self.buffer = self.buffer[:groups], self.buffer[groups:]
            self.admission.consume([g.step for g in taken])
            for g in taken:
                self.pending.pop(g.item.instance_id)
            return taken

    async def finish_step(self) -> None:
        """The trainer stepped: capacity grows by one mini-batch."""
        async with self.changed:
            self.admission.finish_step()
            self.changed.notify_all()

    def state_dict(self) -> dict:
        return {"counts": self.admission.state_dict(), "pending": list(self.pending), "filtered": list(self.filtered_ids)}

    def idle_seconds(self) -> float:
        """Seconds so far with no group generating (the sampler idle)."""
        now = time.perf_counter()
        return self.sampler_idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)

    async def close(self) -> None:
        for task in (self.producer, *self.tasks):
            task.cancel()
        await asyncio.gather(self.producer, *self.tasks, return_exceptions=True)

    async def _produce(self) -> None:
        async with self.changed:
            while True:
                while self.admission.can_submit():
                    item = self.requeue.pop(0) if self.requeue else self.c.train_data.next_batch(1)[0]
                    self.pending[item.instance_id] = item
                    self._running_changed(+1)
                    task = asyncio.create_task(self._run(item, self.admission.submit()))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                await self.changed.wait()

    async def _run(self, item: PromptItem, step: int) -> None:
        # the ledger's group_step counts from 0, as in the sync schedule
        gi = GeneratorInput([item], self.c.config.generator.n_samples_per_prompt, step - 1, self.version())
        try:
            out = await self.c.generator.generate(gi)
        except Exception as exc:  # environment failures are trajectories already: this is a fault
            async with self.changed:
                self.failure = self.failure or exc
                self.changed.notify_all()
            return
        async with self.changed:
            self._running_changed(-1)
            self.admission.complete()
            group = Group(step, item, out)
            if self._useful(out):
                self.buffer.append(group)
            else:
                self._drop(group)
            self.changed.notify_all()

    def _useful(self, out: GeneratorOutput) -> bool:
        if not any(t.stop_reason != FAILED and any(t.loss_mask) for t in out.trajectories):
            return False
        filters = self.c.config.algorithm.filters
        return not filters.zero_variance_filter or has_signal(out.trajectories, filters.zero_variance_tol)

    def _drop(self, g: Group) -> None:
        """A completed group that will not train: reclassified as filtered; its ledger records are kept."""
        if g in self.buffer:
            self.buffer.remove(g)
        self.admission.filter()
        self.pending.pop(g.item.instance_id)
        self.filtered_ids.append(g.item.instance_id)
        self.c.folder.log_trajectories(g.output.trajectories)

    def _running_changed(self, delta: int) -> None:
        now = time.perf_counter()
        running = self.admission.counts.running
        if running == 0 and delta > 0 and self._idle_since is not None:
            self.sampler_idle_s += now - self._idle_since
            self._idle_since = None
        elif running + delta == 0 and delta < 0:
            self._idle_since = now
