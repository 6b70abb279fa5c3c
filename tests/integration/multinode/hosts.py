"""Hosts made of network namespaces on this machine, joined by a bridge, with a Ray node in each.

    with NamespaceHosts(["a", "b"]) as hosts:        # namespaces mrl<id>a, mrl<id>b and a switch mrl<id>s
        hosts.start_ray(head="a", resources={"a": {"host_a": 2}, "b": {"host_b": 1}})
        hosts.run("a", ["python", ...])                # a process inside host a

Each host has loopback and one interface ``eth0`` at 10.213.0.<i>/24 on a bridge that lives in a third
namespace (the "switch"): nothing of the machine's own network is touched, and the only routes lead to
the bridge, which has no uplink. Teardown kills every process left in the namespaces (all started
here) and deletes them, also when the test failed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SUBNET = "10.213.0"
RAY_PORT = 6380
VENV_BIN = Path(sys.executable).parent


class NamespacesUnavailable(RuntimeError):
    """This machine does not let us make network namespaces (no privileges, no ``ip``)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class NamespaceHosts:
    def __init__(self, names: list[str]):
        self.id = secrets.token_hex(2)
        self.switch = f"mrl{self.id}s"
        self.ns = {name: f"mrl{self.id}{name}" for name in names}
        self.addr = {name: f"{SUBNET}.{i + 1}" for i, name in enumerate(names)}
        self.ray_dir = Path(f"/tmp/mrlray{self.id}")
        self.made: list[str] = []
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_ADDRESS": ""}
        """Every process of the cluster (nodes, drivers) runs with it: Ray checks the cluster's token."""

    def __enter__(self) -> "NamespaceHosts":
        if shutil.which("ip") is None:
            raise NamespacesUnavailable("the `ip` command (iproute2) is not installed")
        try:
            self._add(self.switch)
        except subprocess.CalledProcessError as err:
            raise NamespacesUnavailable(f"`ip netns add` failed: {err.stderr.strip()}") from err
        try:
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for name in self.ns:
                self._host(name)
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _host(self, name: str) -> None:
        ns, inner, outer = self.ns[name], f"v{self.id}{name}", f"v{self.id}{name}s"
        self._add(ns)
        _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", outer, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", outer, "master", "br0")
        _ip("-n", self.switch, "link", "set", outer, "up")
        _ip("-n", ns, "link", "set", inner, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "route", "add", "default", "dev", "eth0")  # Ray finds its address by the default route

    def __exit__(self, *exc) -> None:
        self.close()

    def command(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[name], *argv]

    def run(self, name: str, argv: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside host ``name`` (its own session, so it can be signalled as a group)."""
        return subprocess.Popen(self.command(name, argv), env={**os.environ, **self.env, **(env or {})}, start_new_session=True,
                                **kwargs)

    def start_ray(self, head: str, resources: dict[str, dict[str, float]], cpus: int = 2) -> str:
        """A Ray head on ``head`` and a worker on every other host, each with its own address as node address
        and ``resources[host]`` as labels; returns the cluster address."""
        address = f"{self.addr[head]}:{RAY_PORT}"
        common = ["--num-cpus", str(cpus), "--object-store-memory", str(200 << 20), "--disable-usage-stats"]
        order = [head] + [h for h in self.ns if h != head]
        for host in order:
            role = (["--head", f"--port={RAY_PORT}", "--include-dashboard=false", f"--temp-dir={self.ray_dir}"]
                    if host == head else [f"--address={address}"])
            argv = [str(VENV_BIN / "ray"), "start", *role, f"--node-ip-address={self.addr[host]}",
                    f"--resources={json.dumps(resources.get(host, {}))}", *common]
            out = subprocess.run(self.command(host, argv), capture_output=True, text=True, timeout=180,
                                 env={**os.environ, **self.env})
            if out.returncode != 0:
                raise RuntimeError(f"ray start on host {host} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return address

    def pids(self, name: str) -> list[int]:
        out = _ip("netns", "pids", self.ns[name], check=False)
        return [int(p) for p in out.stdout.split()]

    def kill_host(self, name: str) -> None:
        """Every process of host ``name`` dies at once (a node lost), and its link goes down."""
        for pid in self.pids(name):
            _signal(pid, signal.SIGKILL)
        _ip("-n", self.ns[name], "link", "set", "eth0", "down", check=False)

    def close(self) -> None:
        for ns in reversed(self.made):
            pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
            for pid in pids:
                _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while pids and time.monotonic() < deadline:
                time.sleep(0.2)
                pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
            for pid in pids:
                _signal(pid, signal.SIGKILL)
        for ns in reversed(self.made):
            for _ in range(50):  # the kernel may hold a namespace briefly after its last process dies
                if _ip("netns", "del", ns, check=False).returncode == 0:
                    break
                time.sleep(0.2)
        self.made = []
        shutil.rmtree(self.ray_dir, ignore_errors=True)

    def left(self) -> list[str]:
        """Namespaces of this object still present (should be none after close)."""
        listed = _ip("netns", "list", check=False).stdout.split()
        return [ns for ns in [self.switch, *self.ns.values()] if ns in listed]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
