"""One ``megatron-rl serve-training`` (tiny Qwen3, one trainer rank, one vLLM CPU server) shared by the
Tinker SDK tests of this folder; ``restart()`` stops it and starts it again on the same state folder."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from megatron_rl.inference.server_process import free_port
from megatron_rl.tiny import make_tiny_model

os.environ.setdefault("TINKER_API_KEY", "tml-local-test")  # the SDK insists on a key; this service checks none


class Service:
    def __init__(self, model: Path, out: Path):
        self.model, self.out, self.proc = model, out, None
        # one address for the fixture's life: clients made before a restart() reach the restarted service
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        port = self.port
        self.log = open(self.out / f"serve-{port}.log", "a")  # a restart appends to the same port's log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "megatron_rl.cli", "serve-training", f"model={self.model}",
             f"run.output_dir={self.out}", "run.name=tinker", "--port", str(port), "--lora-as-full-finetune"],
            stdout=self.log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.out / f"serve-{port}.log").read_text()[-4000:]
            try:
                urllib.request.urlopen(self.url + "/api/v1/healthz", timeout=2)
                return
            except OSError:
                time.sleep(2)
        self._halt()  # a failed setup has no teardown: leave nothing running
        raise TimeoutError(f"serve-training did not answer within 400 s; log: {self.log.name}")

    def stop(self) -> None:
        assert self._halt() == 0, Path(self.log.name).read_text()[-4000:]

    def _halt(self) -> int | None:
        """Ctrl-C (the service stops its servers and Ray), a kill after 60 s; the exit code."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        finally:
            self.log.close()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="package")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("tinker")
    s = Service(make_tiny_model("qwen3", root / "model", size="small", seed=0), root)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="package")
def sdk(service):
    import tinker

    client = tinker.ServiceClient(base_url=service.url)
    yield client
    # else its session's heartbeat thread outlives the service and logs connection errors; bounded, because the
    # SDK retries a finish it cannot deliver for ever (it hung CI's teardown when restart() moved the port)
    client.close("success").result(timeout=60)


@pytest.fixture(scope="package")
def trainer(sdk):
    """One training client shared by the tests in file order: test_rl_loop (from the base model, whatever
    test_cookbook and test_models trained before), test_sdk, then test_state_restart (which restarts the service)."""
    return sdk.create_lora_training_client(base_model="model", rank=8).result()
