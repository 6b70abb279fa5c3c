"""``megatron-rl serve`` seen from the real ``openai`` client: the router in front of the shared pair of
servers answers completions, chats and streams like vLLM itself, keeps a ``user`` on one replica,
passes upstream errors through unchanged, and a replica killed mid-stream is an error the client sees."""

import json
import os
import signal
import subprocess
import sys
import urllib.request

import openai
import pytest

from megatron_rl.inference.server_process import free_port, wait_healthy

NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def endpoint(servers):
    """``megatron-rl serve`` fronting the shared servers; its base URL (stopped with Ctrl-C at the end)."""
    urls = ",".join(f"'{u}'" for u in servers.urls)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "megatron_rl.cli", "serve", "inference.num_servers=0",
         f"inference.external_server_urls=[{urls}]", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert f"at http://127.0.0.1:{port}/v1 over 2 replica(s)" in line, line + proc.stdout.read()
    yield f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0


@pytest.fixture(scope="module")
def client(endpoint) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def test_completion_with_logprobs(client, model):
    out = client.completions.create(model=model, prompt="the sum of", max_tokens=5, logprobs=1, extra_body=NO_EOS)
    logprobs = out.choices[0].logprobs
    assert out.usage.completion_tokens == 5 and len(logprobs.tokens) == 5
    assert all(lp <= 0 for lp in logprobs.token_logprobs)


def test_chat_completion_and_streamed_chat(client, model):
    messages = [{"role": "user", "content": "what is 2 + 3?"}]
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=6, extra_body=NO_EOS)
    assert out.choices[0].message.role == "assistant" and out.usage.completion_tokens == 6
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True, extra_body=NO_EOS)
    chunks = [c for c in stream if c.choices and c.choices[0].delta.content]
    assert len(chunks) > 1, chunks
    assert stream.response.headers["content-type"].startswith("text/event-stream")


def chat_turns(client, model, user: str, turns: int) -> list[str]:
    """The replica of each turn of a multi-turn chat by ``user``."""
    messages, replicas = [], []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"turn {turn}"})
        raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=4, user=user)
        replicas.append(raw.headers["x-replica"])
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    return replicas


def test_user_field_keeps_a_chat_on_one_replica(client, model, servers):
    alice = chat_turns(client, model, "alice", 3)
    bob = chat_turns(client, model, "bob", 1)
    assert len(set(alice)) == 1 and alice[0] in servers.urls, alice
    assert bob[0] != alice[0]


def test_upstream_errors_pass_through_unchanged(client, servers):
    with pytest.raises(openai.NotFoundError) as routed:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    direct = openai.OpenAI(base_url=servers.urls[0] + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as straight:
        direct.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert routed.value.status_code == 404 and routed.value.body == straight.value.body


def test_tokenize_round_trip(endpoint, model):
    def post(path, body):
        request = urllib.request.Request(endpoint + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.load(resp)

    tokens = post("/tokenize", {"model": model, "prompt": "one two three"})["tokens"]
    assert post("/detokenize", {"model": model, "tokens": tokens})["prompt"] == "one two three"


def test_replica_killed_mid_stream_is_an_error_the_client_sees(client, model, servers):
    """Last in the module: it kills one shared server and starts it again."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "count"}], max_tokens=450, stream=True, extra_body=NO_EOS)
    victim = next(s for s in servers.servers if s.url == raw.headers["x-replica"])
    stream = raw.parse()
    received = [next(iter(stream))]
    try:
        os.killpg(victim.process.pid, signal.SIGKILL)
        with pytest.raises(openai.APIError, match="lost mid-stream"):
            received.extend(stream)
        assert len(received) < 450
    finally:
        victim.stop()
        victim.start()
        wait_healthy([victim], victim.config.startup_timeout_s)
