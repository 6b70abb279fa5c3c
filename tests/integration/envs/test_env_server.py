"""A real ``serve-envs`` process on loopback: token auth, episodes through the ``remote`` env, failures, the
bounded wait at the concurrency limit, SIGTERM mid-episode, and a bounded load test."""

import asyncio
import json
import os
import statistics
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from env_server import TOKEN, TOKEN_ENV, EnvServer, health
from megatron_rl.envs import EnvError, TaskBug, get_env_class, make_env
from megatron_rl.envs.gridsim.tasks import generate_rows

ROW = generate_rows(1, seed=0)[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ[TOKEN_ENV] = TOKEN
    with EnvServer(tmp_path_factory.mktemp("env-server"), max_concurrent=4, max_wait_s=1.0) as s:
        yield s


def remote(url, env_class="gridsim", extras=None, token_env=TOKEN_ENV, **config):
    row = {"url": url, "env_class": env_class, "env_extras": ROW["env_extras"] if extras is None else extras,
           "token_env": token_env}
    return make_env("remote", row, {"reset_deadline_s": 5, "call_timeout_s": 10, **config})


async def episode(url, env_class="gridsim", extras=None, reply=None):
    env = remote(url, env_class, extras)
    try:
        await env.init(ROW["prompt"])
        return await env.step(reply or get_env_class("gridsim").reference_reply(ROW["env_extras"])), env.metrics
    finally:
        env.close()


def get(url, path, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, None


def test_token_is_required_everywhere_but_health(server):
    assert get(server.url, "/health")[0] == 200
    assert get(server.url, "/envs")[0] == 401 and get(server.url, "/tasks", token="nope")[0] == 403
    status, envs = get(server.url, "/envs", token=TOKEN)
    assert status == 200 and envs["gridsim"]["tools"][0]["function"]["name"] == "submit_schedule"
    assert len(get(server.url, "/tasks?split=test", token=TOKEN)[1]) == 2

    async def handshake(headers):
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                await http.ws_connect(server.url.replace("http", "ws") + "/session", headers=headers)
            return err.value.status

    assert asyncio.run(handshake({})) == 403  # the socket is closed before it opens
    assert asyncio.run(handshake({"Authorization": "Bearer wrong"})) == 403
    os.environ["WRONG_TOKEN"] = "wrong"
    with pytest.raises(TaskBug, match="token refused"):
        asyncio.run(remote(server.url, token_env="WRONG_TOKEN").init(ROW["prompt"]))


def test_a_gridsim_episode_through_the_server_scores_like_the_local_env(server):
    result, metrics = asyncio.run(episode(server.url))
    assert result.done and result.reward == 1.0 and metrics["tool_calls"] == 1 and metrics["best_score"] == 1.0
    assert health(server.url)["sessions"] == 0


def test_failures_replayable_or_fatal(server):
    with pytest.raises(EnvError, match="RuntimeError: sandbox crashed") as err:
        asyncio.run(episode(server.url, "test_always_fails", {}))
    assert not isinstance(err.value, TaskBug)  # replayed by the generator
    with pytest.raises(TaskBug, match="no score"):
        asyncio.run(episode(server.url, "test_unscored", {}))
    with pytest.raises(TaskBug, match="needs 'prices'"):
        asyncio.run(episode(server.url, "gridsim", {}))


def test_a_reset_gives_up_at_its_deadline_when_no_server_answers():
    from env_server import free_port

    env = remote(f"http://127.0.0.1:{free_port()}", reset_deadline_s=1.5, retry_interval_s=0.2)
    start = time.perf_counter()
    with pytest.raises(EnvError, match=r"no session within envs.remote.reset_deadline_s=1.5 \(ClientConnectorError"):
        asyncio.run(env.init(ROW["prompt"]))
    assert 1.2 < time.perf_counter() - start < 3
    env.close()


def test_a_row_whose_tools_differ_from_the_servers_stops_with_a_clear_error(server):
    env = make_env("remote", {"url": server.url, "env_class": "gridsim", "env_extras": ROW["env_extras"],
                              "token_env": TOKEN_ENV, "tools": ["run_sql"]})
    with pytest.raises(TaskBug, match=r"row lists tools \['run_sql'\] but the server's env offers \['submit_schedule'\]"):
        asyncio.run(env.init(ROW["prompt"]))
    env.close()


def test_write_rows_counts_prompts_over_the_limit_as_the_generator_renders_them(server, tmp_path):
    import transformers

    from megatron_rl.data.remote_rows import write_rows
    from megatron_rl.tiny import make_tiny_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(make_tiny_model("qwen3", size="unit"))
    # the always-failing task's prompt renders to 19 tokens; every gridsim prompt with its tool to about 600
    counts = write_rows(server.url, tmp_path, tokenizer, TOKEN_ENV, max_prompt_length=100, suffix=".jsonl")
    assert counts == {"dropped_too_long": 5, "train": 1, "eval": 0}
    assert (tmp_path / "train.jsonl").exists() and not (tmp_path / "eval.jsonl").exists()


def test_at_the_limit_a_session_waits_then_is_refused_after_the_bounded_wait(server):
    async def go():
        slow = [asyncio.create_task(episode(server.url, "test_slow_echo", {"sleep_s": 0.6})) for _ in range(4)]
        await asyncio.sleep(0.2)
        waiter = asyncio.create_task(episode(server.url, "test_slow_echo", {"sleep_s": 0.0}))  # waits ~0.4 s
        await asyncio.sleep(0.2)
        stuck = [asyncio.create_task(episode(server.url, "test_slow_echo", {"sleep_s": 3.0})) for _ in range(4)]
        await asyncio.sleep(0.3)
        refused = asyncio.create_task(episode(server.url, "test_slow_echo", {"sleep_s": 0.0}))  # waits > 1 s
        done = await asyncio.gather(*slow, waiter, *stuck, refused, return_exceptions=True)
        return done

    results = asyncio.run(go())
    assert all(r[0].reward == 1.0 for r in results[:9]), results
    assert isinstance(results[9], EnvError) and "concurrency limit" in str(results[9])
    assert health(server.url)["sessions"] == 0


def test_load_at_the_concurrency_limit_reports_latency_and_leaks_no_session(server):
    """64 episodes from 8 concurrent clients against a limit of 4 (half of them wait for a slot); bounded:
    about 64 * 0.05 / 4 = 0.8 s of env time, 60 s at most."""
    async def one():
        start = time.perf_counter()
        await episode(server.url, "test_slow_echo", {"sleep_s": 0.05})
        return time.perf_counter() - start

    async def go():
        limit = asyncio.Semaphore(8)

        async def bounded():
            async with limit:
                return await one()

        return await asyncio.wait_for(asyncio.gather(*(bounded() for _ in range(64))), 60)

    before = health(server.url)["served"]
    start = time.perf_counter()
    latencies = sorted(asyncio.run(go()))
    wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    print(f"\nload: 64 episodes, 8 clients, server limit 4, in {wall:.2f}s ({64 / wall:.1f}/s); latency p50 {q[49] * 1e3:.0f} ms, "
          f"p90 {q[89] * 1e3:.0f} ms, p99 {q[98] * 1e3:.0f} ms, max {latencies[-1] * 1e3:.0f} ms")
    after = health(server.url)
    assert after["sessions"] == 0 and after["waiting"] == 0 and after["served"] - before == 64
    assert q[49] >= 0.05


def test_sigterm_mid_episode_closes_it_and_a_reset_waits_for_the_restart(tmp_path):
    os.environ[TOKEN_ENV] = TOKEN
    server = EnvServer(tmp_path).start()

    async def go():
        env = remote(server.url)
        await env.init(ROW["prompt"])
        assert health(server.url)["sessions"] == 1
        await asyncio.to_thread(server.stop)
        with pytest.raises(EnvError, match="connection lost|closed by the server"):
            await env.step("<tool_call>{}</tool_call>")
        env.close()
        asyncio.get_running_loop().call_later(3, server.start)  # back within the reset deadline
        start = time.perf_counter()
        result, _ = await episode(server.url)
        return result, time.perf_counter() - start

    try:
        result, waited = asyncio.run(go())
    finally:
        server.stop()
    assert result.reward == 1.0 and waited > 3
    # the mid-episode session's handler closed its env and counted it before the server exited
    assert "stopped; 1 episodes served, 0 still open were closed" in (tmp_path / "env-server-0.log").read_text()
