"""Managed servers start healthy, fail with their log tail, and leave no process behind."""

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from megatron_rl.inference.config import ServerConfig
from megatron_rl.inference.launcher import LocalServers
from megatron_rl.inference.server_process import ManagedServer, ServerStartError, wait_healthy

DRIVER = Path(__file__).with_name("fleet_main.py")


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_ctrl_c_stops_managed_servers_and_leaves_no_orphans(moe_model, tmp_path):
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(moe_model), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []  # read as it comes, so a full pipe can never block the driver
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)
    reader.start()
    pids: list[int] = []
    try:
        for line in proc.stdout:
            if line.startswith("PIDS "):
                pids = [int(p) for p in line.split()[1:]]
                break
        if len(pids) < 2:  # the driver ended early: let its stderr reach the message
            proc.wait(timeout=30)
            reader.join(5)
        assert len(pids) >= 2, f"driver did not start an API server and engine: {''.join(stderr)[-3000:]}"
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)  # the server gets 20 s of SIGTERM grace
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # the driver dumps every thread's stack
            time.sleep(2)
            proc.kill()
            reader.join(5)
            logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in tmp_path.rglob("*.log"))
            pytest.fail(f"the driver did not exit within 60 s of SIGINT; its stacks and stderr:\n"
                        f"{''.join(stderr)[-6000:]}\nserver logs:\n{logs}")
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 30
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(pids), f"orphaned server processes: {_alive(pids)}"


def test_a_killed_api_server_takes_its_engine_core_with_it(moe_model, tmp_path):
    """SIGKILL reaches the API server alone (Slurm after KillWait, the OOM killer); without the plugin in
    megatron_rl/vllm_plugin.py the engine core lived on, an orphan holding its memory and core."""
    config = ServerConfig(model_path=str(moe_model), max_model_len=512, kv_cache_gib=0.25, run_dir=str(tmp_path))
    server = ManagedServer(config, 0, on_cpu=True)
    server.start()
    try:
        wait_healthy([server], 300)
        api = psutil.Process(server.process.pid)
        engine = [p for p in api.children(recursive=True) if p.name().startswith("VLLM::EngineCore")]
        assert engine, [p.name() for p in api.children(recursive=True)]
        api.kill()
        server.process.wait()
        _, alive = psutil.wait_procs(engine, timeout=15)
        assert not alive, f"the engine core outlived its API server: {alive}"
    finally:
        server.stop(grace_s=5)


def test_server_that_cannot_start_fails_with_its_log_tail(tmp_path):
    config = ServerConfig(model_path=str(tmp_path / "no_such_model"), run_dir=str(tmp_path), startup_timeout_s=120)
    with pytest.raises(ServerStartError, match="exited with code") as err:
        LocalServers(config, num=1).start()
    assert "no_such_model" in str(err.value)
