"""The Slurm launchers on a real Slurm 22.05 cluster built inside the test run: munged and slurmctld on a login
host, one slurmd on each of two compute hosts (network namespaces on a bridge, tests/integration/multinode/
hosts.py). ``megatron-rl slurm submit`` submits the tiny recipe on both nodes from the login host, as a user would.

Needs root (namespaces, apt-get for slurmctld/slurmd/munge/shellcheck when absent); skips where it cannot have
them. ``MEGATRON_RL_SKIP_SLURM=1`` skips it on purpose (a laptop without root).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_cluster import NODES, SlurmCluster, SlurmUnavailable, ensure_packages

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(os.environ.get("MEGATRON_RL_SKIP_SLURM") == "1", reason="MEGATRON_RL_SKIP_SLURM=1")]

ROOT = Path(__file__).resolve().parents[3]
MEGATRON_RL = str(Path(sys.executable).parent / "megatron-rl")
# The smallest run that still has every phase: 2 SFT steps, then RL steps without evaluation, a checkpoint
# after each step, the trainer on node 0 (the head) and the vLLM server on node 1.
QUICK = ["recipe=tiny_cpu", "sft.steps=2", "schedule.eval_every=0", "schedule.checkpoint_every=1",
         "data.train_batch_size=4", "generator.n_samples_per_prompt=4", "data.num_generated_eval=8",
         "placement.servers=ray", "+placement.trainer_resources.slurm_node_0=1",
         "+placement.server_resources.slurm_node_1=1"]
SUBMIT = ["--nodes", "2", "--gpus-per-node", "0", "--time", "30", "--env", "MRL_RAY_CPUS=2",
          "--env", f"MRL_RAY_OBJECT_STORE_BYTES={200 << 20}"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
        c.__enter__()
    except SlurmUnavailable as err:
        pytest.skip(f"no Slurm cluster here: {err}")
    try:
        yield c
    finally:
        c.close()
    assert not c.hosts.left(), f"namespaces left behind: {c.hosts.left()}"


def _submit(cluster, out: Path, *words: str) -> str:
    argv = [MEGATRON_RL, "slurm", "submit", *QUICK, f"run.output_dir={out}", *SUBMIT, *words]
    done = cluster.login(argv, cwd="/", timeout=300)  # from any directory
    job = re.search(r"submitted job (\d+)", done.stdout)
    assert job, done.stdout + done.stderr
    return job.group(1)


def _wait_job(cluster, job: str, timeout_s: float, until=None) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = cluster.job_state(job)
        if until is not None and until():
            return state
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return state
        time.sleep(2)
    raise AssertionError(f"job {job} still {cluster.job_state(job)} after {timeout_s} s")


def _batch_log(run: Path, job: str) -> str:
    path = run / "slurm" / f"batch-{job}.log"
    return path.read_text(errors="replace") if path.exists() else f"(no {path})"


def _steps(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if "reward/mean" in r]


def _left_behind(cluster) -> dict[str, list[str]]:
    """Every process still in a compute host (the slurmd excepted), by command line."""
    left = {}
    for node in NODES:
        lines = []
        for pid in cluster.node_pids(node):
            try:
                lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
            except OSError:
                pass
        if lines:
            left[node] = lines
    return left


def _no_process_left(cluster, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while _left_behind(cluster) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _left_behind(cluster), f"processes left on the compute hosts: {_left_behind(cluster)}"


def test_shellcheck_passes_on_every_launcher():
    try:  # shellcheck comes with the cluster's packages; this test may run before any cluster installed them
        ensure_packages()
    except SlurmUnavailable as e:
        pytest.skip(str(e))
    scripts = sorted(p for p in (ROOT / "slurm").iterdir() if p.suffix in (".sh", ".sbatch"))
    assert len(scripts) >= 2
    out = subprocess.run(["shellcheck", "-x", *map(str, scripts)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_train_on_two_nodes_then_scancel_then_resume(cluster, tmp_path):
    run = tmp_path / "tiny_cpu"
    job = _submit(cluster, tmp_path, "schedule.total_steps=2")
    state = _wait_job(cluster, job, 600)
    log = _batch_log(run, job)
    assert state == "COMPLETED", f"job {job} {state}:\n{log[-5000:]}"

    # metrics for the configured steps, a checkpoint, per-node logs, a Ray node on each host
    assert [r["step"] for r in _steps(run)] == [1, 2], log[-3000:]
    assert (run / "checkpoints" / "step_2").is_dir(), sorted(p.name for p in (run / "checkpoints").iterdir())
    logs = run / "slurm" / job
    assert (logs / "ray-head-a.log").exists() and (logs / "ray-worker-b.log").exists(), sorted(os.listdir(logs))
    assert "all 2 node(s) joined" in log, log[-3000:]
    head = (logs / "ray-head-a.log").read_text()
    worker = (logs / "ray-worker-b.log").read_text()
    assert cluster.hosts.addr["a"] in head and cluster.hosts.addr["b"] in worker, (head[-2000:], worker[-2000:])
    assert re.search(r"server\(s\) up on their nodes: \['http://" + re.escape(cluster.hosts.addr["b"]), log), log[-3000:]
    _no_process_left(cluster)
    assert not list(Path("/tmp").glob(f"ray_{job}_*")), "a Ray node's temp dir was left behind"

    # resubmitted with run.resume=latest, it continues from step 2's checkpoint; scancel mid-run stops everything
    job2 = _submit(cluster, tmp_path, "schedule.total_steps=40", "run.resume=latest")
    _wait_job(cluster, job2, 600, until=lambda: len(_steps(run)) >= 3)
    assert cluster.job_state(job2) == "RUNNING", _batch_log(run, job2)[-3000:]
    cluster.login(["scancel", job2])
    assert _wait_job(cluster, job2, 120) == "CANCELLED", _batch_log(run, job2)[-3000:]
    _no_process_left(cluster)
    steps = [r["step"] for r in _steps(run)]
    assert steps[:3] == [1, 2, 3], steps  # step 3 follows the checkpoint of step 2: resumed, not restarted
    assert "resumed from" in _batch_log(run, job2), _batch_log(run, job2)[-3000:]


def test_a_node_whose_ray_worker_never_starts_fails_the_job_naming_it(cluster, tmp_path):
    setup = tmp_path / "setup.sh"  # node b hangs in its setup (a stuck module load, say) and never starts Ray
    setup.write_text('if [[ "$(hostname)" == b ]]; then sleep 3600; fi\n')
    run = tmp_path / "tiny_cpu"
    started = time.monotonic()
    job = _submit(cluster, tmp_path, "schedule.total_steps=1", "--ray-wait-s", "40", "--node-setup", str(setup))
    state = _wait_job(cluster, job, 240)
    took = time.monotonic() - started
    log = _batch_log(run, job)
    assert state == "FAILED", f"{state}:\n{log[-3000:]}"
    assert re.search(r"1 of 2 node\(s\) missing .*: b \(slurm_node_1\) has not joined", log), log[-3000:]
    assert took < 40 + 60, f"the job took {took:.0f} s to fail with a 40 s wait"
    assert not (run / "metrics.jsonl").exists()
    _no_process_left(cluster)


def test_a_clean_stop_reaches_the_driver_as_sigint_and_leaves_nothing(cluster, tmp_path):
    """``scancel -b -s TERM`` (what the time limit's warning does too): the batch shell's trap sends SIGINT to the
    driver, waits for it, then stops the Ray nodes; a driver that ignored SIGINT would train on for the grace
    period (MRL_STOP_GRACE_S, 60 s) and then be killed."""
    run = tmp_path / "tiny_cpu"
    job = _submit(cluster, tmp_path, "schedule.total_steps=200")
    _wait_job(cluster, job, 600, until=lambda: len(_steps(run)) >= 1)
    assert cluster.job_state(job) == "RUNNING", _batch_log(run, job)[-3000:]
    stopped = time.monotonic()
    cluster.login(["scancel", "-b", "-s", "TERM", job])
    _wait_job(cluster, job, 120)
    took = time.monotonic() - stopped
    log = _batch_log(run, job)
    assert "TERM received, stopping the driver" in log, log[-3000:]
    assert took < 45, f"the clean stop took {took:.0f} s:\n{log[-3000:]}"
    assert len(_steps(run)) < 150, "the driver trained on after SIGINT"
    _no_process_left(cluster)
    assert not list(Path("/tmp").glob(f"ray_{job}_*")), "a Ray node's temp dir was left behind"
