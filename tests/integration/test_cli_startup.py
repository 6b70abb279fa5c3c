"""Start-up of ``megatron-rl train`` and ``serve`` from outside: bad inputs stop them before anything starts
(exit code 2, one line naming the path or key and the fix, under 15 s), and Ctrl-C while vLLM starts exits
within 10 s. Either way no process is left behind (children carry a marker in their environment; none may
survive the command)."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import signal

import psutil
import pytest

from megatron_rl.tiny import make_tiny_model

MARKER = "MRL_CLI_STARTUP_TEST"


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory):
    """A function making a changed copy of the tiny checkpoint."""
    source = make_tiny_model("qwen3", size="unit", seed=0)

    def copy(name: str, corrupt: tuple = (), architectures: list | None = None):
        folder = tmp_path_factory.mktemp(name)
        shutil.copytree(source, folder, dirs_exist_ok=True)
        for file in corrupt:
            (folder / file).write_text('{"truncated": ')
        if architectures is not None:
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, "architectures": architectures}))
        return folder

    return copy


def rows_file(folder, rows: list[dict]):
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_cli(*words: str) -> tuple[int, str, float]:
    """Run the CLI; (exit code, stderr, seconds). Fails if a process it started outlives it."""
    marker = uuid.uuid4().hex
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "megatron_rl.cli", *words], capture_output=True, text=True,
                              timeout=60, env={**os.environ, MARKER: marker})
    finally:
        left = marked(marker)
        for process in left:
            process.kill()
    assert not left, f"processes left behind: {left}"
    return proc.returncode, proc.stderr, time.monotonic() - start


def marked(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if _environ(p).get(MARKER) == marker]


def _environ(process) -> dict:
    try:
        return process.environ()
    except (psutil.Error, OSError):
        return {}


def assert_one_line_error(words, *fragments):
    code, err, elapsed = run_cli(*words)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert all(f in err for f in fragments), err
    assert elapsed < 15, elapsed


def test_missing_model_folder(tmp_path):
    missing = tmp_path / "nope"
    assert_one_line_error(["train", f"model.path={missing}"], f"model.path={missing}", "no such folder")
    assert_one_line_error(["serve", f"model={missing}"], f"model.path={missing}", "no such folder")


def test_hub_id_is_refused_at_once():
    assert_one_line_error(["serve", "model=Qwen/Qwen3-0.6B"], "model.path=Qwen/Qwen3-0.6B", "huggingface-cli download")


def test_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    assert_one_line_error(["train", f"model.path={tmp_path}"], f"model.path={tmp_path}", "no config.json")


def test_broken_tokenizer(model_copy):
    folder = model_copy("badtok", corrupt=("tokenizer.json",))
    assert_one_line_error(["serve", f"model={folder}"], f"model.path={folder}", "tokenizer does not load")


def test_unsupported_architecture(model_copy):
    folder = model_copy("gpt2", architectures=["GPT2LMHeadModel"])
    assert_one_line_error(["train", f"model.path={folder}"], "GPT2LMHeadModel", "Qwen3ForCausalLM")


def test_row_missing_a_column_and_a_field_its_env_needs(tmp_path):
    prompt = [{"role": "user", "content": "1+1?"}]
    bad_column = rows_file(tmp_path, [{"prompt": prompt, "env_class": "arithmetic", "split": "train"}])
    assert_one_line_error(["train", f"data.train_files=[{bad_column}]"], f"{bad_column} row 0", "env_extras")
    bad_field = rows_file(tmp_path, [{"prompt": prompt, "env_class": "arithmetic", "env_extras": {}, "split": "train"}])
    assert_one_line_error(["train", f"data.train_files=[{bad_field}]"], f"{bad_field} row 0", "answer")


def test_prompt_length_leaves_no_room_for_a_response():
    assert_one_line_error(["train", "data.max_prompt_length=96"], "data.max_prompt_length=96", "generator.max_input_length")


def test_output_folder_is_a_file(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("")
    assert_one_line_error(["train", f"run.output_dir={taken}/runs"], f"run.output_dir={taken}/runs", "is a file")


def interrupt_during_startup(argv: list[str]) -> tuple[int, str, float]:
    """Run ``argv``, send SIGINT 3 s after its vLLM server process appears; (exit code, stderr, seconds from
    SIGINT to exit). Fails if a process it started outlives it."""
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, MARKER: marker})
    try:
        deadline = time.monotonic() + 60
        while not any("api_server" in " ".join(p.cmdline()) for p in marked(marker) if p.pid != proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, "no vLLM server started"
            time.sleep(0.2)
        time.sleep(3)  # well inside the server's start-up (tens of seconds on this machine)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        code = proc.wait(timeout=30)
        elapsed = time.monotonic() - start
    finally:
        left = [p for p in marked(marker) if p.pid != proc.pid]
        for process in left:
            process.kill()
    assert not left, f"processes left behind: {left}"
    return code, proc.stderr.read(), elapsed


def test_ctrl_c_while_serve_starts_vllm_exits_within_10_s():
    model = make_tiny_model("qwen3", size="unit", seed=0)
    code, err, elapsed = interrupt_during_startup(
        [sys.executable, "-m", "megatron_rl.cli", "serve", f"model={model}", "inference.num_servers=1",
         "inference.server.kv_cache_gib=0.25", "inference.server.max_model_len=256"])
    assert code == 130 and "interrupted" in err, err
    assert elapsed < 10, elapsed


ASYNC_START = """
import asyncio, sys
from megatron_rl.inference.config import ServerConfig
from megatron_rl.inference.launcher import LocalServers

async def main():  # as a training run starts its fleet: a blocking start inside asyncio.run
    LocalServers(ServerConfig(model_path=sys.argv[1], max_model_len=256, kv_cache_gib=0.25), 1).start()
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_one_ctrl_c_under_asyncio_run_stops_a_starting_server():
    """asyncio.run's own SIGINT handler only cancels its task; one Ctrl-C must still end the start-up."""
    model = make_tiny_model("qwen3", size="unit", seed=0)
    code, err, elapsed = interrupt_during_startup([sys.executable, "-c", ASYNC_START, str(model)])
    assert code != 0 and "KeyboardInterrupt" in err, err
    assert elapsed < 10, elapsed
