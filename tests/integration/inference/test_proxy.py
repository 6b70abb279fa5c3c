"""The HTTP proxy (what external users and Slurm recipes call) routes with the same sticky policy,
and the fleet client works against an external fleet: proxy for data, servers for control."""

import asyncio

import aiohttp
from aiohttp import web

from megatron_rl.inference import GenerationRequest, InferenceConfig, InferenceFleet, RouterConfig, SamplingParams
from megatron_rl.inference.protocol import SESSION_HEADER
from megatron_rl.inference.proxy import REPLICA_HEADER, make_app
from megatron_rl.inference.server_process import free_port


async def session_turns(http, url: str, model: str, session: str, turns: int) -> list[str]:
    prompt, replicas = [50, 51, 52], []
    for turn in range(turns):
        payload = {"model": model, "prompt": prompt, "max_tokens": 6, "return_token_ids": True, "seed": turn}
        async with http.post(url + "/v1/completions", json=payload, headers={SESSION_HEADER: session}) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.json()
            replicas.append(resp.headers[REPLICA_HEADER])
        prompt = prompt + body["choices"][0]["token_ids"] + [20, 21]
    return replicas


def test_proxy_keeps_sessions_sticky_and_serves_an_external_fleet(servers):
    port = free_port()
    proxy_url = f"http://127.0.0.1:{port}"

    async def main():
        runner = web.AppRunner(make_app(servers.urls, RouterConfig()))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            config = InferenceConfig(num_servers=0, external_proxy_url=proxy_url, external_server_urls=servers.urls)
            async with InferenceFleet(config) as fleet:
                result = await fleet.generate(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=4)))
                await fleet.set_weight_version("proxy-1")
                versions = await fleet.control.weight_versions()
                async with aiohttp.ClientSession() as http:
                    placements = await asyncio.gather(
                        *(session_turns(http, proxy_url, fleet.model, f"p{i}", 3) for i in range(4)))
            return result, versions, placements
        finally:
            await runner.cleanup()

    result, versions, placements = asyncio.run(main())
    assert result.replica == proxy_url and len(result.token_ids) == 4
    assert set(versions) == set(servers.urls) and set(versions.values()) == {"proxy-1"}
    assert all(len(set(p)) == 1 for p in placements), placements
    assert {p[0] for p in placements} == set(servers.urls)
