"""Start N managed vLLM servers together and make sure they all go away again: as subprocesses of the
driver on its host (``LocalServers``), or each from a Ray actor on the node Ray places it, bound to that
node's address and seeing only the devices Ray gave the actor (``RayServers``)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import signal
import tempfile
import threading

from megatron_rl.inference.config import ServerConfig
from megatron_rl.inference.server_process import LOOPBACK, ManagedServer, wait_healthy

log = logging.getLogger(__name__)
ABORT_GRACE_S = 3.0
"""Grace after SIGTERM when start-up is aborted (Ctrl-C, a failed server): a vLLM server still loading
may not act on SIGTERM until it is up, and it holds nothing worth a clean shutdown yet."""


@contextlib.contextmanager
def _ctrl_c_interrupts():
    """Ctrl-C raises KeyboardInterrupt inside the block, also under ``asyncio.run``: its own handler only
    cancels the main task, which a blocking wait for health does not see until the servers are up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def on_cpu() -> bool:
    """Whether this process sees no CUDA device (vLLM runs its CPU build here)."""
    import torch

    return not torch.cuda.is_available()


def _checked(config: ServerConfig) -> ServerConfig:
    if not config.model_path:
        raise ValueError("inference.server.model_path: empty; point it at an HF checkpoint directory")
    if not config.run_dir:
        config = dataclasses.replace(config, run_dir=tempfile.mkdtemp(prefix="megatron_rl_inference_"))
    return config


class LocalServers:
    """``num`` servers on ``host`` (this host's address); a context manager (stops on exit, Ctrl-C and
    exceptions) that also stops them at interpreter exit if the caller forgets. With ``secret`` every route
    but ``/health`` needs it."""

    def __init__(self, config: ServerConfig, num: int, host: str = LOOPBACK, secret: str | None = None, first: int = 0):
        config = _checked(config)
        cpu = on_cpu()
        self.servers = [ManagedServer(config, first + i, cpu, host, secret) for i in range(num)]
        self.timeout_s = config.startup_timeout_s

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self) -> "LocalServers":
        """Start all servers (call from a long-lived thread: servers die with the starting thread)
        and wait for their health; on any failure, stop them all and re-raise."""
        atexit.register(self.stop)
        try:
            for server in self.servers:
                server.start()
            log.info("inference: waiting for %d vLLM server(s): %s", len(self.servers), self.urls)
            with _ctrl_c_interrupts():
                wait_healthy(self.servers, self.timeout_s)
        except BaseException:
            self.stop(grace_s=ABORT_GRACE_S)
            raise
        return self

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop every server, giving each ``grace_s`` after SIGTERM before SIGKILL."""
        for server in self.servers:
            server.stop(grace_s)
        atexit.unregister(self.stop)

    def lost_nodes(self, timeout_s: float = 10.0, silent_is_lost: bool = True) -> list[str]:
        """Nodes whose servers went away with them: none, the servers run on this host."""
        return []

    def __enter__(self) -> "LocalServers":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _ServerHost:
    """A Ray actor holding one managed server on its node (the server dies with the actor's process)."""

    def start(self, config: ServerConfig, index: int, secret: str | None) -> str:
        from parallel.worker_group import node_address

        self.local = LocalServers(config, 1, node_address(), secret, first=index)
        return self.local.start().urls[0]

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        self.local.stop()


class RayServers:
    """``num`` servers, each started by a Ray actor asking for ``resources`` (node labels) and the server's
    GPUs, with its entry of ``actor_options`` (e.g. its placement-group bundle); same interface as
    :class:`LocalServers`."""

    def __init__(self, config: ServerConfig, num: int, resources: dict | None = None, secret: str | None = None,
                 actor_options: list[dict] | None = None):
        self.config, self.num, self.secret = _checked(config), num, secret
        self.actor_options = actor_options or [{}] * num
        """Ray options per server's actor (e.g. its placement-group bundle)."""
        gpus = 0 if on_cpu() else config.tensor_parallel_size
        import ray

        self._actor = ray.remote(num_cpus=0, num_gpus=gpus, resources=dict(resources or {}))(_ServerHost)
        self.hosts: list = []
        self.urls: list[str] = []

    def start(self) -> "RayServers":
        import ray

        atexit.register(self.stop)
        try:
            self.hosts = [self._actor.options(**opts).remote() for opts in self.actor_options]
            self.urls = ray.get([h.start.remote(self.config, i, self.secret) for i, h in enumerate(self.hosts)])
            log.info("inference: %d vLLM server(s) up on their nodes: %s", self.num, self.urls)
        except BaseException:
            self.stop()
            raise
        return self

    def lost_nodes(self, timeout_s: float = 10.0, silent_is_lost: bool = True) -> list[str]:
        """Addresses of the nodes of this fleet's servers that Ray counts dead, whose server actor died, or (with
        ``silent_is_lost``) whose actor does not answer within ``timeout_s`` (Ray takes up to a minute to declare
        a node that stopped answering dead; a busy machine can also be slow to answer)."""
        import ray
        from urllib.parse import urlsplit

        alive = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        pings = [host.ping.remote() for host in self.hosts]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s)
        lost = set()
        for url, ping in zip(self.urls, pings):
            node = urlsplit(url).hostname
            if node not in alive or (ping not in ready and silent_is_lost) or (ping in ready and _failed(ping)):
                lost.add(node)
        return sorted(lost)

    def stop(self) -> None:
        import ray

        for host in self.hosts:
            try:
                ray.get(host.stop.remote(), timeout=60)
            except Exception as err:  # a lost node: its server went with it
                log.warning("inference: stopping a server on its node failed: %s", err)
            ray.kill(host)
        self.hosts = []
        atexit.unregister(self.stop)


def _failed(ref) -> bool:
    import ray

    try:
        ray.get(ref, timeout=0)
        return False
    except Exception:  # the actor died with its node
        return True
