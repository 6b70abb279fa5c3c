"""Start and stop a real ``megatron-rl serve-envs`` process on loopback for the tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BUNDLE = str(Path(__file__).with_name("bundle.py"))
TOKEN_ENV = "MEGATRON_RL_TEST_ENV_TOKEN"
TOKEN = "s3cret-token-for-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


class EnvServer:
    """``serve-envs`` in a child process; ``stop()`` sends SIGTERM, ``start()`` starts it again on the same port."""

    def __init__(self, log_dir: Path, port: int | None = None, max_concurrent: int = 8, max_wait_s: float = 60.0):
        self.port, self.log_dir = port or free_port(), log_dir
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--max-concurrent", str(max_concurrent), "--max-wait-s", str(max_wait_s)]
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 60) -> EnvServer:
        cmd = [sys.executable, "-m", "megatron_rl.cli", "serve-envs", BUNDLE, "--port", str(self.port),
               "--token-env", TOKEN_ENV, *self.args]
        log = open(self.log_dir / f"env-server-{self.starts}.log", "w")
        self.starts += 1
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, TOKEN_ENV: TOKEN})
        deadline = time.time() + timeout
        while health(self.url) is None:
            assert self.proc.poll() is None, (self.log_dir / f"env-server-{self.starts - 1}.log").read_text()
            assert time.time() < deadline, "env server did not start"
            time.sleep(0.2)
        return self

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def __enter__(self) -> EnvServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
