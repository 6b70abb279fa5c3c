"""Start N managed vLLM servers together and make sure they all go away again."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import tempfile

from megatron_rl.inference.config import ServerConfig
from megatron_rl.inference.server_process import ManagedServer, wait_healthy

log = logging.getLogger(__name__)


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


class LocalServers:
    """``num`` servers on 127.0.0.1; a context manager (stops on exit, Ctrl-C and exceptions) that
    also stops them at interpreter exit if the caller forgets."""

    def __init__(self, config: ServerConfig, num: int):
        if not config.model_path:
            raise ValueError("inference.server.model_path: empty; point it at an HF checkpoint directory")
        if not config.run_dir:
            config = dataclasses.replace(config, run_dir=tempfile.mkdtemp(prefix="megatron_rl_inference_"))
        on_cpu = _on_cpu()
        self.servers = [ManagedServer(config, i, on_cpu) for i in range(num)]
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
            wait_healthy(self.servers, self.timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        atexit.unregister(self.stop)

    def __enter__(self) -> "LocalServers":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
