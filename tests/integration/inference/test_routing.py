"""Sticky sessions stay on one replica; a replica killed mid-batch loses no request."""

import asyncio
import dataclasses
import os
import signal

from megatron_rl.inference import GenerationRequest, SamplingParams
from megatron_rl.inference.server_process import wait_healthy

from helpers import run_with_fleet

TURNS, SESSIONS = 3, 6


async def multi_turn(fleet, sessions: int, turns: int) -> dict[str, list[str]]:
    """Each session appends its sampled ids and an observation, turn after turn; returns replicas."""

    async def session(i: int) -> list[str]:
        prompt, replicas = [10 + i, 11, 12, 13], []
        for turn in range(turns):
            result = await fleet.generate(
                GenerationRequest(prompt, SamplingParams(max_tokens=8, seed=turn), session_id=f"traj-{i}"))
            prompt = prompt + result.token_ids + [20, 21, 22]
            replicas.append(result.replica)
        return replicas

    return dict(zip(range(sessions), await asyncio.gather(*(session(i) for i in range(sessions)))))


def test_sticky_least_loaded_keeps_every_turn_of_a_session_on_one_replica(fleet_config):
    placements = run_with_fleet(fleet_config, lambda fleet: multi_turn(fleet, SESSIONS, TURNS))
    for session, replicas in placements.items():
        assert len(set(replicas)) == 1, f"session {session} moved between replicas: {replicas}"
    used = {replicas[0] for replicas in placements.values()}
    assert len(used) == 2, "first turns must spread over both replicas (least loaded)"


def test_round_robin_moves_sessions_between_replicas(fleet_config):
    config = dataclasses.replace(fleet_config, router=dataclasses.replace(fleet_config.router, policy="round_robin"))
    placements = run_with_fleet(config, lambda fleet: multi_turn(fleet, SESSIONS, TURNS))
    assert any(len(set(r)) > 1 for r in placements.values())


def test_killing_a_replica_mid_batch_loses_no_request(fleet_config, servers):
    victim = servers.servers[1]
    sampling = SamplingParams(max_tokens=240, ignore_eos=True, seed=1)

    async def body(fleet):
        tasks = [asyncio.create_task(fleet.generate(GenerationRequest([30 + i, 31, 32], sampling, session_id=f"k{i}")))
                 for i in range(12)]
        while not any(r.url == victim.url and r.in_flight >= 3 for r in fleet.router.replicas):
            await asyncio.sleep(0.05)
        # At once, and with long requests: a fresh-clone run (120 tokens, a 0.5 s wait here) had the victim
        # finish every request it held before the kill, and nothing was left to retry.
        os.kill(victim.process.pid, signal.SIGKILL)  # a crash, not a clean stop
        return await asyncio.gather(*tasks)

    try:
        results = run_with_fleet(fleet_config, body)
        assert len(results) == 12
        assert all(len(r.token_ids) == 240 and r.stop_reason == "length" for r in results)
        retried = [r for r in results if r.attempts > 1]
        assert retried, "some requests were on the killed replica and must have been retried"
        placed = [(r.replica, r.attempts) for r in retried]
        assert all(r.replica == servers.servers[0].url for r in retried), f"retries must land on the survivor: {placed}"
        assert all(r.routed_experts is None and r.routed_experts_start == 0 for r in results)
    finally:
        victim.stop()
        victim.start()
        wait_healthy([victim], 400)


def test_a_replica_taken_out_returns_to_rotation_when_healthy(fleet_config):
    async def body(fleet):
        replica = fleet.router.replicas[1]
        fleet.router.take_out(replica, "test")
        out = [await fleet.generate(GenerationRequest([1, 2], SamplingParams(max_tokens=2))) for _ in range(3)]
        await fleet.router.probe()
        back = replica.healthy
        return out, back, replica.url

    out, back, url = run_with_fleet(fleet_config, body)
    assert all(r.replica != url for r in out)
    assert back
