"""One pair of real vLLM CPU servers (tiny Qwen3-MoE, float32) shared by every inference test."""

from pathlib import Path

import pytest

from megatron_rl.inference.config import InferenceConfig, ServerConfig
from megatron_rl.inference.launcher import LocalServers
from megatron_rl.tiny import make_tiny_model

HERE = Path(__file__).parent
RUN_DIR = Path("/tmp/inference-eng/servers")


def pytest_collection_modifyitems(config, items):
    """Run the tests that launch their own servers before the shared pair starts, so no more than
    two servers run at once (the root conftest marks the tier)."""
    slots = [k for k, item in enumerate(items) if Path(str(item.fspath)).parent == HERE]  # the rest keep their places
    ordered = sorted((items[k] for k in slots), key=lambda item: Path(str(item.fspath)).name != "test_lifecycle.py")
    for k, item in zip(slots, ordered):
        items[k] = item


def server_config(model_path: Path, run_dir: Path = RUN_DIR) -> ServerConfig:
    return ServerConfig(
        model_path=str(model_path), dtype="float32", max_model_len=512, kv_cache_gib=0.25,
        run_dir=str(run_dir), startup_timeout_s=400,
    )


@pytest.fixture(scope="session")
def moe_model() -> Path:
    return make_tiny_model("qwen3_moe", size="unit", seed=0)


@pytest.fixture(scope="session")
def servers(moe_model):
    """Two managed servers for the whole session (stopped at its end)."""
    with LocalServers(server_config(moe_model), num=2) as local:
        yield local


@pytest.fixture
def fleet_config(servers) -> InferenceConfig:
    """A client config over the shared servers (each test makes its own fleet and event loop)."""
    return InferenceConfig(num_servers=0, external_server_urls=servers.urls)

