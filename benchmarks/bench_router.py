"""Router overhead and sticky-session prefix-cache reuse, on real vLLM servers.

1. Overhead: the same ``--concurrency`` requests (token-id prompts, ``--max-tokens`` each, EOS
   ignored) sent to one vLLM server three ways, interleaved round by round so machine noise hits all
   alike: directly (aiohttp), through the in-process fleet router, and through the HTTP proxy, both
   routing to that one server. Reports median tokens/s per way and the router's overhead
   (target: under 5% at 64 concurrent requests).
2. OpenAI chat latency: what a user of ``megatron-rl serve`` sees. The ``openai`` client sends the same
   chat (a ~200-token conversation, ``--max-tokens`` answer) directly to the server and through the
   router running as its own process, alternating, ``--chat-requests`` times each, one at a time and
   streamed; reports median latency per way and the router's overhead (target: under 5%).
3. Prefix reuse: a multi-turn workload (``--sessions`` sessions of ``--turns`` turns; each turn
   appends the sampled ids and an observation to a prompt longer than one KV block) over two
   servers, once with ``sticky_least_loaded`` and once with ``least_loaded``, prefix caches reset in
   between; turn lengths and env delays vary per session so that sessions do not move in lockstep.
   Reports the servers' own prefix-cache hit rate (hit tokens / queried tokens).

    python benchmarks/bench_router.py [--concurrency 64] [--max-tokens 64] [--rounds 5] [--sections overhead,chat,prefix]
                                      [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request

import aiohttp
from aiohttp import web

from megatron_rl.inference import GenerationRequest, InferenceConfig, InferenceFleet, RouterConfig, SamplingParams
from megatron_rl.inference import ServerConfig
from megatron_rl.inference.launcher import LocalServers
from megatron_rl.inference.protocol import completion_payload
from megatron_rl.inference.proxy import make_app
from megatron_rl.inference.server_process import free_port
from megatron_rl.tiny import make_tiny_model

TARGET_OVERHEAD = 0.05


def prompts(n: int, length: int, offset: int = 0) -> list[list[int]]:
    return [[(offset + 31 * i + 7 * j) % 1900 + 10 for j in range(length)] for i in range(n)]


async def direct(url: str, model: str, batch: list[GenerationRequest]) -> int:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def one(req):
            async with http.post(url + "/v1/completions", json=completion_payload(req, model, None)) as resp:
                return (await resp.json())["usage"]["completion_tokens"]
        return sum(await asyncio.gather(*(one(r) for r in batch)))


async def via_fleet(fleet: InferenceFleet, batch: list[GenerationRequest]) -> int:
    return sum(len(r.token_ids) for r in await asyncio.gather(*(fleet.generate(r) for r in batch)))


async def timed(coro) -> float:
    start = time.perf_counter()
    tokens = await coro
    return tokens / (time.perf_counter() - start)


async def overhead(url: str, args) -> dict:
    sampling = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, seed=0)
    batch = [GenerationRequest(p, sampling, cache_salt=None) for p in prompts(args.concurrency, 32)]
    port = free_port()
    runner = web.AppRunner(make_app([url], RouterConfig(policy="sticky_least_loaded")))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    router_cfg = InferenceConfig(num_servers=0, external_server_urls=[url])
    proxy_cfg = InferenceConfig(num_servers=0, external_server_urls=[url], external_proxy_url=f"http://127.0.0.1:{port}")
    rates: dict[str, list[float]] = {"direct": [], "router": [], "proxy": []}
    try:
        async with InferenceFleet(router_cfg) as fleet, InferenceFleet(proxy_cfg) as proxied:
            await fleet.control.reset_prefix_cache()
            await direct(url, fleet.model, batch)  # warm-up
            for _ in range(args.rounds):
                rates["direct"].append(await timed(direct(url, fleet.model, batch)))
                rates["router"].append(await timed(via_fleet(fleet, batch)))
                rates["proxy"].append(await timed(via_fleet(proxied, batch)))
    finally:
        await runner.cleanup()
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "concurrency": args.concurrency, "max_tokens": args.max_tokens, "rounds": args.rounds,
        **{f"{k}_tokens_per_s": round(v, 1) for k, v in med.items()},
        "router_overhead": round(1 - med["router"] / med["direct"], 4),
        "proxy_overhead": round(1 - med["proxy"] / med["direct"], 4),
        "target_overhead": TARGET_OVERHEAD,
    }


CHAT = [
    {"role": "system", "content": "You are a careful assistant that answers arithmetic questions step by step. " * 4},
    {"role": "user", "content": "A shop sells pens at 3 euros and notebooks at 5 euros. " * 3 + "What do 4 pens cost?"},
    {"role": "assistant", "content": "Four pens at three euros each cost twelve euros in total. " * 2},
    {"role": "user", "content": "And 2 notebooks and 3 pens together? Explain each step briefly."},
]


def start_router(url: str) -> tuple[subprocess.Popen, str]:
    """``python -m megatron_rl.inference.proxy`` in front of ``url``, as ``megatron-rl serve`` runs it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "megatron_rl.inference.proxy", "--host", "127.0.0.1",
                             "--port", str(port), url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the router did not come up") from None
            time.sleep(0.3)


async def chat_once(client, model: str, max_tokens: int, stream: bool) -> float:
    start = time.perf_counter()
    out = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=max_tokens, stream=stream,
                                               extra_body={"ignore_eos": True})
    if stream:
        async for _ in out:
            pass
    return time.perf_counter() - start


async def chat_latency(url: str, args) -> dict:
    import openai

    router, router_url = start_router(url)
    try:
        clients = {way: openai.AsyncOpenAI(base_url=u + "/v1", api_key="unused", max_retries=0)
                   for way, u in (("direct", url), ("router", router_url))}
        model = (await clients["direct"].models.list()).data[0].id
        result = {}
        for stream in (False, True):
            times: dict[str, list[float]] = {"direct": [], "router": []}
            for way in times:  # warm-up
                await chat_once(clients[way], model, args.max_tokens, stream)
            for _ in range(args.chat_requests):
                for way in times:
                    times[way].append(await chat_once(clients[way], model, args.max_tokens, stream))
            med = {way: statistics.median(v) for way, v in times.items()}
            kind = "stream" if stream else "plain"
            result[kind] = {"direct_median_ms": round(1000 * med["direct"], 1), "router_median_ms": round(1000 * med["router"], 1),
                            "router_overhead": round(med["router"] / med["direct"] - 1, 4)}
        return {"requests_each": args.chat_requests, "max_tokens": args.max_tokens, **result,
                "target_overhead": TARGET_OVERHEAD}
    finally:
        router.terminate()
        router.wait()


async def multi_turn_hit_rate(urls: list[str], policy: str, args, offset: int) -> float:
    config = InferenceConfig(num_servers=0, external_server_urls=urls, router=RouterConfig(policy=policy))
    async with InferenceFleet(config) as fleet:
        await fleet.control.reset_prefix_cache()
        before = await fleet.metrics()

        async def session(i: int, prompt: list[int]):
            rng = random.Random(i)  # uneven turns and env steps, as in real rollouts
            for turn in range(args.turns):
                sampling = SamplingParams(max_tokens=rng.randint(8, 48), ignore_eos=True, seed=turn)
                prompt = prompt + (await fleet.generate(GenerationRequest(prompt, sampling, session_id=f"{policy}-{i}"))).token_ids
                await asyncio.sleep(rng.uniform(0, 0.2))
                prompt = prompt + [20, 21, 22, 23]

        await asyncio.gather(*(session(i, p) for i, p in enumerate(prompts(args.sessions, 160, offset))))
        after = await fleet.metrics()
    hits = sum(after[f"inference/replica{i}/prefix_cache_hits"] - before[f"inference/replica{i}/prefix_cache_hits"]
               for i in range(len(urls)))
    queries = sum(after[f"inference/replica{i}/prefix_cache_queries"]
                  - before[f"inference/replica{i}/prefix_cache_queries"] for i in range(len(urls)))
    return hits / queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="HF checkpoint (default: the tiny Qwen3-MoE)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--chat-requests", type=int, default=30)
    parser.add_argument("--sections", default="overhead,chat,prefix", help="comma-separated parts to run")
    parser.add_argument("--run-dir", default="/tmp/megatron_rl_bench_router")
    parser.add_argument("--out", default="", help="also write the JSON result here")
    args = parser.parse_args()
    model = args.model or str(make_tiny_model("qwen3_moe", size="unit", seed=0))
    config = ServerConfig(model_path=model, max_model_len=512, kv_cache_gib=0.5, run_dir=args.run_dir)
    sections = args.sections.split(",")
    result = {}
    with LocalServers(config, num=2 if "prefix" in sections else 1) as local:
        if "overhead" in sections:
            result["overhead"] = asyncio.run(overhead(local.urls[0], args))
        if "chat" in sections:
            result["openai_chat"] = asyncio.run(chat_latency(local.urls[0], args))
        if "prefix" in sections:
            result["prefix_cache_hit_rate"] = {
                policy: round(asyncio.run(multi_turn_hit_rate(local.urls, policy, args, offset)), 4)
                for offset, policy in enumerate(("sticky_least_loaded", "least_loaded"))
            }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
