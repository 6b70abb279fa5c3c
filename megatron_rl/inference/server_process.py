"""One managed vLLM OpenAI API server: a supervised subprocess on its node's address with a free port
chosen there. With a run secret, every route but ``/health`` needs it (``inference/auth.py``); the secret
travels in the server's environment, never on its command line.

On CPU each server's whole process tree (API server, engine core, and the worker, which runs inside the engine
core with one worker: ``server_env``) is pinned to one core, the ``index``-th this process may use: vLLM pins only
the worker's OpenMP threads, and an engine core busy-waits on a worker in another process (``sched_yield`` on
shared memory; TP > 1), so two unpinned engine cores beside two pinned workers left the API servers without a
core for up to 15 s and streamed output in bursts (measured with 2 servers on 2 cores, the worker apart: a
500-token stream's first tokens arrived after 0.02-3.3 s unpinned, 0.02-0.06 s pinned, and the 2 x 2 streams
finished in 2.6-3.0 s instead of 3.3-5.8 s). ``VLLM_CPU_OMP_THREADS_BIND`` set by the user turns this off.

The server runs in its own session (so a terminal's Ctrl-C reaches only us) and gets SIGTERM if
the thread that started it dies (PR_SET_PDEATHSIG), its engine core SIGKILL if the API server dies
(``megatron_rl/vllm_plugin.py``), so a crashed driver or a killed server leaves no orphans; ``stop``
ends its whole process group (API server and engine core).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from megatron_rl.env_vars import ENGINE_DIES_WITH_SERVER, RUN_SECRET, cache_dir
from megatron_rl.inference.config import ServerConfig
from megatron_rl.vllm_plugin import die_with_parent


class ServerStartError(RuntimeError):
    """A managed server exited or did not become healthy in time."""


LOOPBACK = "127.0.0.1"
_MIDDLEWARE = "megatron_rl.inference.auth.RequireRunSecret"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _setup_child(core: int | None) -> None:
    die_with_parent(signal.SIGTERM)
    if core is not None:
        os.sched_setaffinity(0, {core})


def server_core(index: int, on_cpu: bool) -> int | None:
    """The core the ``index``-th CPU server is pinned to; None on GPU or when the user binds threads."""
    if not on_cpu or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return None
    cores = sorted(os.sched_getaffinity(0))
    return cores[index % len(cores)]


@functools.cache
def _gates_scale_out() -> bool:
    """Whether the installed vLLM serves ``/inference/v1/generate`` only with ``--enable-scale-out`` (releases after
    0.26, the CPU build's 0.32 among them). Read from its source: importing vLLM here would cost seconds."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return False
    args = Path(spec.origin).parent / "entrypoints" / "launchers" / "cli_args.py"
    return args.exists() and "enable_scale_out" in args.read_text()


def server_command(config: ServerConfig, port: int, seed: int, host: str = LOOPBACK, guarded: bool = False) -> list[str]:
    """The ``api_server`` command line (the ``vllm`` console script is absent on the CPU build); ``guarded``
    loads the middleware that checks the run secret."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", config.model_path,
        "--host", host, "--port", str(port),
        "--dtype", config.dtype or "float32",
        "--max-model-len", str(config.max_model_len),
        "--tensor-parallel-size", str(config.tensor_parallel_size),
        "--seed", str(seed),
        # log-probs of the distribution a token was drawn from (temperature applied), as the trainer computes them
        # (TrainingBatch.temperature); at temperature 1 with top_p 1 they equal the raw ones
        "--logprobs-mode", "processed_logprobs",
    ]
    if config.worker_extension:
        cmd += ["--worker-extension-cls", config.worker_extension]
    if config.kv_cache_gib:
        cmd += ["--kv-cache-memory-bytes", str(int(config.kv_cache_gib * (1 << 30)))]
    else:
        cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    if config.routed_experts == "native":
        cmd.append("--enable-return-routed-experts")
    if _gates_scale_out():
        cmd.append("--enable-scale-out")  # the token-in/token-out route (native R3) is off by default there
    if guarded:
        cmd += ["--middleware", _MIDDLEWARE]
    return cmd + list(config.extra_args)


def server_env(config: ServerConfig, index: int, on_cpu: bool, ipc_dir: str, secret: str | None) -> dict[str, str]:
    """Environment: dev-mode control routes, the run secret, temp files and IPC sockets in ``ipc_dir`` (a unix
    socket path may not exceed 107 bytes, so not under a deep run folder), vLLM's and the compile caches shared
    across runs, the worker's threads on the server's core. On CPU with one worker, the worker runs inside the
    engine core process (vLLM's CPU platform spawns it apart unless ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): a
    server then spawns one process instead of two, each of which imports torch and vLLM again. Measured with a
    tiny Qwen3 on an idle 2-core machine: /health after 23 s instead of 30 s, and 16.5 s with vLLM's cache of
    model-class inspections kept across runs; the same time for 3 requests."""
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": ipc_dir,
        "VLLM_RPC_BASE_PATH": ipc_dir,
        ENGINE_DIES_WITH_SERVER: "1",  # megatron_rl/vllm_plugin.py
    }
    if secret:
        env[RUN_SECRET] = secret
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
    env.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))  # model-class inspections, keyed by vLLM's source
    if on_cpu and config.tensor_parallel_size == 1:
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker inside the engine core: one spawn less
    core = server_core(index, on_cpu)
    if core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    return env


class ManagedServer:
    """Start, health-wait and stop one server listening on ``host`` (the address of the node it runs on);
    its log goes to ``<run_dir>/server<i>.log``."""

    def __init__(self, config: ServerConfig, index: int, on_cpu: bool, host: str = LOOPBACK, secret: str | None = None):
        self.config = config
        self.index = index
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.log_path = Path(config.run_dir) / f"server{index}.log"
        self.process: subprocess.Popen | None = None
        self._cmd = server_command(config, self.port, config.seed + index, host, guarded=bool(secret))
        self.ipc_dir = tempfile.mkdtemp(prefix="mrl-")
        self._env = server_env(config, index, on_cpu, self.ipc_dir, secret)
        self._core = server_core(index, on_cpu)

    def start(self) -> None:
        Path(self.config.run_dir).mkdir(parents=True, exist_ok=True)
        Path(self.ipc_dir).mkdir(exist_ok=True)  # stop() removes it; a restart needs it back
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                self._cmd, env=self._env, stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=functools.partial(_setup_child, self._core),
            )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.returncode
            raise ServerStartError(f"vLLM server {self.index} ({self.url}) exited with code {code}.\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return f"(no log at {self.log_path})"
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL whatever is left after ``grace_s``."""
        if self.process is None:
            return
        pgid = self.process.pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(pgid, signal.SIGKILL)
        self.process.wait()
        self.process = None
        shutil.rmtree(self.ipc_dir, ignore_errors=True)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def wait_healthy(servers: list[ManagedServer], timeout_s: float) -> None:
    """Block until every server answers ``/health``; ServerStartError with the log tail otherwise."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        for server in list(pending):
            server.check_alive()
            if server.healthy():
                pending.remove(server)
        if pending and time.monotonic() > deadline:
            server = pending[0]
            raise ServerStartError(
                f"vLLM server {server.index} ({server.url}) not healthy after {timeout_s:.0f} s "
                f"(inference.server.startup_timeout_s).\n{server.log_tail()}"
            )
        time.sleep(0.5)
