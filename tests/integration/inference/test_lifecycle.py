"""Managed servers start healthy, fail with their log tail, and leave no process behind."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from megatron_rl.inference.config import ServerConfig
from megatron_rl.inference.launcher import LocalServers
from megatron_rl.inference.server_process import ServerStartError

DRIVER = Path(__file__).with_name("fleet_main.py")


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_ctrl_c_stops_managed_servers_and_leaves_no_orphans(moe_model, tmp_path):
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(moe_model), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        for line in proc.stdout:
            if line.startswith("PIDS "):
                pids = [int(p) for p in line.split()[1:]]
                break
        assert len(pids) >= 2, f"driver did not start an API server and engine: {proc.stderr.read()[-3000:]}"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 30
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(pids), f"orphaned server processes: {_alive(pids)}"


def test_server_that_cannot_start_fails_with_its_log_tail(tmp_path):
    config = ServerConfig(model_path=str(tmp_path / "no_such_model"), run_dir=str(tmp_path), startup_timeout_s=120)
    with pytest.raises(ServerStartError, match="exited with code") as err:
        LocalServers(config, num=1).start()
    assert "no_such_model" in str(err.value)
