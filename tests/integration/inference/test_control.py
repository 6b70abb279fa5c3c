"""Control plane over real servers: pause keep/abort/wait, resume, versions, sleep refused on CPU."""

import asyncio
import json
import os
import time

import aiohttp
import pytest

from megatron_rl.inference import GenerationRequest, SamplingParams, UnsupportedOnPlatform
from megatron_rl.inference.protocol import completion_payload

from helpers import run_with_fleet

LONG = SamplingParams(max_tokens=500, ignore_eos=True, seed=5)  # near the servers' 512-token context


def requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest([40 + i, 41, 42], LONG, session_id=f"c{i}") for i in range(n)]


class Stream:
    """One streamed completion straight to a replica; the client counts each token as it arrives, so a
    test knows what was sampled without the server's counters (which lag on a starved CPU)."""

    def __init__(self, url: str, payload: dict):
        self.url, self.payload = url, {**payload, "stream": True}
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None

    async def run(self) -> "Stream":
        async with aiohttp.ClientSession() as http:
            async with http.post(self.url + "/v1/completions", json=self.payload) as resp:
                assert resp.status == 200, await resp.text()
                async for line in resp.content:
                    text = line.decode().strip()
                    if not text.startswith("data: ") or text == "data: [DONE]":
                        continue
                    choice = json.loads(text[len("data: "):])["choices"][0]
                    self.token_ids += choice.get("token_ids") or []
                    self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return self


async def streaming(fleet, n: int, at_least: int = 4) -> tuple[list[Stream], list[asyncio.Task]]:
    """``n`` long streams spread over the replicas, returned once each has received ``at_least`` tokens."""
    urls = [r.url for r in fleet.router.replicas]
    streams = [Stream(urls[i % len(urls)], completion_payload(r, fleet.model, None)) for i, r in enumerate(requests(n))]
    tasks = [asyncio.create_task(s.run()) for s in streams]
    deadline = time.monotonic() + 180
    while min(len(s.token_ids) for s in streams) < at_least:
        for t in tasks:
            if t.done():
                t.result()  # raises what ended a stream early
                raise AssertionError(f"a stream ended after {[len(s.token_ids) for s in streams]} tokens")
        assert time.monotonic() < deadline, f"streams did not reach {at_least} tokens in 180 s"
        await asyncio.sleep(0.02)
    return streams, tasks


async def settled(streams: list[Stream], quiet_s: float = 1.5, limit_s: float = 30.0) -> list[int]:
    """Token counts once no stream has received a token for ``quiet_s`` (tokens sampled before a pause may
    still be in transit when it returns); fails if they keep coming for ``limit_s``."""
    deadline, counts, since = time.monotonic() + limit_s, None, time.monotonic()
    while True:
        now = [len(s.token_ids) for s in streams]
        if now != counts:
            counts, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return counts
        assert time.monotonic() < deadline, f"tokens kept arriving for {limit_s} s while paused: {counts}"
        await asyncio.sleep(0.05)


def test_each_cpu_server_runs_whole_on_its_own_core(servers):
    """The pause tests below need streams that arrive as they are sampled; that holds only when an engine
    core's busy-wait cannot take the API servers' CPU (server_process.py has the measurements)."""
    cores = sorted(os.sched_getaffinity(0))
    seen = []
    for i, server in enumerate(servers.servers):
        group = [int(p) for p in os.listdir("/proc") if p.isdigit() and _group_of(int(p)) == server.process.pid]
        names = {open(f"/proc/{p}/comm").read().strip() for p in group}
        assert "VLLM::EngineCor" in names and "VLLM::Worker" not in names, names  # the worker inside the core
        affinities = {frozenset(os.sched_getaffinity(p)) for p in group}
        assert affinities == {frozenset({cores[i % len(cores)]})}, (names, affinities)
        seen.append(affinities)
    assert seen[0] != seen[1], "the two servers share a core"


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_pause_keep_freezes_requests_and_resume_completes_them_intact(fleet_config):
    async def body(fleet):
        reference = await asyncio.gather(*(fleet.generate(r) for r in requests(4)))
        streams, tasks = await streaming(fleet, 4)
        await fleet.control.pause("keep")
        paused = await fleet.control.is_paused()
        frozen_at = await settled(streams)
        await asyncio.sleep(2.0)
        after_wait = [len(s.token_ids) for s in streams]
        done_while_paused = [t.done() for t in tasks]
        await fleet.control.resume()
        await asyncio.gather(*tasks)
        return reference, streams, paused, frozen_at, after_wait, done_while_paused

    reference, streams, paused, frozen_at, after_wait, done_while_paused = run_with_fleet(fleet_config, body)
    assert all(paused.values()) and len(paused) == 2
    assert after_wait == frozen_at, "no token may be sampled while paused with keep"
    assert not any(done_while_paused) and all(4 <= n < LONG.max_tokens for n in frozen_at), frozen_at
    for ref, s in zip(reference, streams):
        assert s.finish_reason == "length" and len(s.token_ids) == LONG.max_tokens
        assert s.token_ids == ref.token_ids, "a frozen request must resume to the same tokens"


def test_pause_abort_returns_partial_outputs_marked_abort(fleet_config):
    """The requests are frozen first (keep), so that every one is known to be in flight when the abort
    lands: on 2 cores a 500-token request can otherwise finish between the client's count and the pause."""

    async def body(fleet):
        streams, tasks = await streaming(fleet, 4)
        await fleet.control.pause("keep")
        frozen_at = await settled(streams)
        running = [not t.done() for t in tasks]
        await fleet.control.pause("abort")
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        await fleet.control.resume()
        # ignore_eos: a random tiny model samples EOS within 3 tokens often enough to fail a CI run ('stop')
        after = await fleet.generate(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True)))
        return streams, frozen_at, running, after

    streams, frozen_at, running, after = run_with_fleet(fleet_config, body)
    assert all(running)
    for s, n in zip(streams, frozen_at):
        assert s.finish_reason == "abort"
        assert len(s.token_ids) == n and 4 <= n < LONG.max_tokens, (len(s.token_ids), n)
    assert after.stop_reason == "length", "generation resumes after pause(abort) + resume"


def test_pause_wait_drains_in_flight_requests(fleet_config):
    async def body(fleet):
        streams, tasks = await streaming(fleet, 4)
        await fleet.control.pause("wait")
        # Every request finished before the pause returned; the last chunks may still be on their way.
        done, _ = await asyncio.wait(tasks, timeout=60)
        drained = [t in done for t in tasks]
        paused = await fleet.control.is_paused()
        await fleet.control.resume()
        return drained, paused, streams

    drained, paused, streams = run_with_fleet(fleet_config, body)
    assert all(drained) and all(paused.values())
    assert all(s.finish_reason == "length" and len(s.token_ids) == LONG.max_tokens for s in streams)


def test_weight_versions_are_set_and_read_back_from_every_replica(fleet_config):
    async def body(fleet):
        await fleet.set_weight_version("step-7")
        versions = await fleet.control.weight_versions()
        result = await fleet.generate(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=2)))
        return versions, result

    versions, result = run_with_fleet(fleet_config, body)
    assert versions == {url: "step-7" for url in fleet_config.external_server_urls}
    assert result.weight_version == "step-7"


def test_sleep_is_refused_on_cpu_replicas_and_other_routes_answer(fleet_config):
    async def body(fleet):
        with pytest.raises(UnsupportedOnPlatform, match="CPU"):
            await fleet.control.sleep()
        await fleet.control.reset_prefix_cache()
        return await fleet.control.devices(), await fleet.control.health()

    devices, health = run_with_fleet(fleet_config, body)
    assert set(devices.values()) == {"cpu"} and all(health.values())
