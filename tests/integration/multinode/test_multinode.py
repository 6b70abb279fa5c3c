"""Two hosts made of network namespaces, a Ray node on each: the tiny MoE recipe trains with its two expert-
parallel ranks on host a and its vLLM server on host b, and the weights cross between them.

Needs root (``ip netns add``); skips with the reason where namespaces cannot be made. Everything the test
starts lives in its namespaces, which are deleted (their processes killed) even when a test fails.
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hosts import NamespaceHosts, NamespacesUnavailable

pytestmark = pytest.mark.timeout(1500)

HERE = Path(__file__).parent
QUICK = ["sft.steps=2", "schedule.eval_every=0"]
PLACED = ["placement.servers=ray", "+placement.trainer_resources.host_a=1", "+placement.server_resources.host_b=1"]


@pytest.fixture(scope="module")
def hosts():
    cluster = NamespaceHosts(["a", "b"])
    try:
        cluster.__enter__()
    except NamespacesUnavailable as err:
        pytest.skip(f"no network namespaces here: {err}")
    try:
        cluster.ray_address = cluster.start_ray("a", {"a": {"host_a": 2}, "b": {"host_b": 1}})
        yield cluster
    finally:
        cluster.close()
    assert not cluster.left(), f"namespaces left behind: {cluster.left()}"


def _train(hosts, out: Path, secret: str, *words: str) -> tuple[subprocess.Popen, Path]:
    log = out / "driver.log"
    argv = [sys.executable, "-m", "megatron_rl.cli", "train", "recipe=tiny_moe_cpu", f"run.output_dir={out}",
            *QUICK, *PLACED, *words]
    env = {"RAY_ADDRESS": hosts.ray_address, "MEGATRON_RL_RUN_SECRET": secret, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        proc = hosts.run("a", argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=os.getcwd())
    return proc, log


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float, watch: Path | None = None) -> re.Match:
    """Until ``pattern`` appears in ``watch`` (default: the run's log); failures show the log's tail."""
    watch = watch or log
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(pattern, watch.read_text(errors="replace") if watch.exists() else "")
        if found:
            return found
        assert proc.poll() is None, f"the run ended ({proc.returncode}) before /{pattern}/:\n{log.read_text()[-4000:]}"
        time.sleep(1)
    raise AssertionError(f"no /{pattern}/ in the run's log within {timeout_s} s:\n{log.read_text()[-4000:]}")


def _probe(hosts, url: str, secret: str) -> dict:
    out = subprocess.run(hosts.command("a", [sys.executable, str(HERE / "probe.py"), url]), capture_output=True,
                         text=True, timeout=120, env={**os.environ, "MEGATRON_RL_RUN_SECRET": secret})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def _cmdlines(hosts, name: str) -> list[str]:
    lines = []
    for pid in hosts.pids(name):
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return lines


def test_recipe_trains_across_two_hosts_on_their_addresses(hosts, tmp_path):
    a, b = hosts.addr["a"], hosts.addr["b"]
    secret = secrets.token_urlsafe(24)
    proc, log = _train(hosts, tmp_path, secret, "schedule.total_steps=2")
    try:
        server = _wait_for(log, r"server\(s\) up on their nodes: \['(http://[^']+)'\]", proc, 600).group(1)
        answers = _probe(hosts, server, secret)  # from host a, over the bridge, while the run trains
        assert not any(secret in line for line in _cmdlines(hosts, "b")), "the secret is on a command line"
        code = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text(errors="replace")
    assert code == 0, text[-4000:]

    # the rendezvous, the ranks, the server and the transfer's stores used the hosts' addresses
    nodes = ast.literal_eval(re.search(r"rank\(s\) on nodes (\[[^\]]*\])", text).group(1))
    assert nodes == [a, a]
    assert re.search(rf"rendezvous tcp://{re.escape(a)}:\d+", text)
    assert server.startswith(f"http://{b}:")
    stores = re.findall(r"senders' stores at (\{[^}]*\})", text)
    assert stores and all(set(addr.split(":")[0] for addr in ast.literal_eval(s).values()) == {a} for s in stores)
    assert "127.0.0.1" not in "".join(re.findall(r".*(?:rendezvous|stores at|up on their nodes).*", text))

    # a request without the run's secret is refused on every route but /health; the run's own calls went through
    assert answers["plain"] == {"/health": 200, "/v1/models": 401, "/collective_rpc": 401, "/pause": 401,
                                "/update_weight_version": 401, "/server_info": 401}, answers
    assert answers["with_secret"] == {"/v1/models": 200}, answers
    assert secret not in text and not any(secret in p.read_text(errors="replace") for p in tmp_path.rglob("*.log"))

    # vLLM on host b serves the trainer's weights after each transfer (the same check as the one-host MoE test)
    metrics = [json.loads(line) for line in (tmp_path / "tiny_moe_cpu" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/mean" in m]
    assert len(steps) == 2 and all(m["weight_transfer/quarantined"] == 0 for m in steps)
    assert all(m["policy/rollout_train_logprob_abs_diff_first"] < 1e-4 for m in steps), steps

    # the run stopped its server on host b: no vLLM process is left there
    assert not [line for line in _cmdlines(hosts, "b") if "vllm" in line]


def test_a_placement_that_cannot_fit_fails_before_anything_starts(hosts, tmp_path):
    proc, log = _train(hosts, tmp_path, "s", "schedule.total_steps=1", "+placement.server_resources.host_c=1")
    assert proc.wait(timeout=300) == 2, log.read_text()[-3000:]
    assert re.search(r"no node carries \{[^}]*'host_c': 1[^}]*\} for the inference", log.read_text())


def test_losing_the_inference_host_mid_run_fails_in_bounded_time_naming_it(hosts, tmp_path):
    b = hosts.addr["b"]
    proc, log = _train(hosts, tmp_path, secrets.token_urlsafe(24), "schedule.total_steps=50",
                       "inference.router.request_timeout_s=30", "weight_transfer.timeout_s=30")
    try:
        # step 1 trained: its record in the metrics file (console lines are for people and change)
        _wait_for(log, r'"reward/mean"', proc, 900, watch=tmp_path / "tiny_moe_cpu" / "metrics.jsonl")
        hosts.kill_host("b")
        killed = time.monotonic()
        code = proc.wait(timeout=300)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text(errors="replace")
    assert code != 0, text[-3000:]
    assert took < 240, f"the run took {took:.0f} s to fail after host b died"
    tail = text[-4000:]
    assert re.search(rf"inference node\(s\) {re.escape(b)} lost", tail), tail
