"""``megatron-rl slurm submit``: the sbatch script of ``slurm/ray.sbatch`` with its header filled from the flags
and the recipe, checked against the allocation with ``plan`` before anything is submitted.

The script is self-contained (header, MRL_* settings, the recipe's overrides, the launcher's body) and is kept
in the run folder, so a job can be resubmitted as it was: ``sbatch <run>/slurm/<name>.sbatch``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_DIR = Path(__file__).resolve().parents[2] / "slurm"
"""The launchers (``ray.sbatch``, ``ray_node.sh``) beside the package; the compute nodes must see this folder
(shared storage, or a container mount)."""
LAUNCHER = SLURM_DIR / "ray.sbatch"
NODE_LABEL = "slurm_node_{}"
_TIME = re.compile(r"^(\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2})$")
_WARN_S = 300
"""Seconds before the time limit at which the batch shell gets USR1 (a clean stop; at most a tenth of the limit)."""
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class SubmitRequest:
    overrides: list[str]
    nodes: int
    gpus_per_node: int
    time: str
    partition: str = ""
    account: str = ""
    container_image: str = ""
    container_mounts: str = ""
    gpu_kind: str = "H100"
    env: list[str] = field(default_factory=list)
    node_setup: str = ""
    ray_wait_s: int = 600
    sbatch_args: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Each flag a user can get wrong, named with its fix, before the config is even read."""
        if self.nodes < 1:
            raise ValueError(f"--nodes: {self.nodes} must be >= 1")
        if self.gpus_per_node < 0:
            raise ValueError(f"--gpus-per-node: {self.gpus_per_node} must be >= 0 (0 for CPU nodes)")
        if not _TIME.match(self.time):
            raise ValueError(f"--time: {self.time!r} is not a Slurm time limit; write MINUTES, HH:MM:SS or "
                             "DAYS-HH:MM:SS (e.g. --time 4:00:00)")
        if time_limit_s(self.time) < 60:
            raise ValueError(f"--time: {self.time!r} is under a minute; give the run a time limit (e.g. --time 4:00:00)")
        if self.ray_wait_s < 1:
            raise ValueError(f"--ray-wait-s: {self.ray_wait_s} must be >= 1 second")
        for item in self.env:
            if not _ENV.match(item):
                raise ValueError(f"--env: {item!r} must be NAME=VALUE (e.g. --env NCCL_DEBUG=WARN)")
        if self.node_setup and not Path(self.node_setup).is_file():
            raise ValueError(f"--node-setup: {self.node_setup} is not a file (a bash file sourced on every node)")
        if not LAUNCHER.is_file():
            raise ValueError(f"the launcher {LAUNCHER} is missing: install megatron-rl from its source tree "
                             "(pip install -e .) on storage the compute nodes share")


def time_limit_s(text: str) -> int:
    """Slurm's time formats in seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
    else:
        h, m, sec = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def _cluster(req: SubmitRequest):
    from megatron_rl.runtime.cluster import Cluster, Node

    nodes = tuple(Node(f"node{i}", req.gpus_per_node, labels={NODE_LABEL.format(i): 1000}) for i in range(req.nodes))
    return Cluster(nodes, req.gpu_kind if req.gpus_per_node else "CPU")


def prepare(req: SubmitRequest) -> tuple[str, Path, str]:
    """(script, run folder, plan): the recipe resolved, its run folder made absolute, its placement checked
    on ``nodes`` x ``gpus_per_node`` (a PlacementError names what does not fit)."""
    from megatron_rl.config import load_config
    from megatron_rl.runtime.plan import render

    req.check()
    cfg = load_config(req.overrides)
    out = Path(cfg.run.output_dir).expanduser().resolve()
    run_dir = out / cfg.run.name
    if (run_dir / "metrics.jsonl").exists() and cfg.run.resume != "latest":
        raise ValueError(f"run.name: run folder {run_dir} already holds a run; pass run.resume=latest to continue "
                         "it or choose another run.name")
    plan = render(cfg, _cluster(req))
    overrides = [w for w in req.overrides if not w.startswith("run.output_dir=")] + [f"run.output_dir={out}"]
    return script(req, run_dir, cfg.run.name, overrides), run_dir, plan


def script(req: SubmitRequest, run_dir: Path, name: str, overrides: list[str]) -> str:
    header = [f"#SBATCH --job-name=mrl-{name}", f"#SBATCH --nodes={req.nodes}", "#SBATCH --ntasks-per-node=1",
              "#SBATCH --exclusive", f"#SBATCH --time={req.time}", f"#SBATCH --output={run_dir}/slurm/batch-%j.log",
              f"#SBATCH --signal=B:USR1@{min(_WARN_S, time_limit_s(req.time) // 10)}"]
    if req.gpus_per_node:
        header.append(f"#SBATCH --gpus-per-node={req.gpus_per_node}")
    header += [f"#SBATCH --partition={req.partition}"] * bool(req.partition)
    header += [f"#SBATCH --account={req.account}"] * bool(req.account)
    header += [f"#SBATCH {arg}" for arg in req.sbatch_args]
    settings = {"MRL_RUN_DIR": str(run_dir), "MRL_SLURM_DIR": str(SLURM_DIR), "MRL_GPUS_PER_NODE": str(req.gpus_per_node),
                "MRL_RAY_WAIT_S": str(req.ray_wait_s), "MRL_MEGATRON_RL": _beside_python("megatron-rl"),
                "MRL_RAY": _beside_python("ray")}
    if req.container_image:  # in a container the image's own commands are used, not this machine's paths
        settings.update(MRL_CONTAINER_IMAGE=req.container_image, MRL_MEGATRON_RL="megatron-rl", MRL_RAY="ray")
    if req.container_mounts:
        settings["MRL_CONTAINER_MOUNTS"] = req.container_mounts
    if req.node_setup:
        settings["MRL_NODE_SETUP"] = str(Path(req.node_setup).resolve())
    lines = [f"export {k}={shlex.quote(v)}" for k, v in settings.items()]
    lines += [f"export {item.split('=', 1)[0]}={shlex.quote(item.split('=', 1)[1])}" for item in req.env]
    body = [line for line in LAUNCHER.read_text().splitlines()[1:] if not line.startswith("#SBATCH")]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return "\n".join([
        "#!/usr/bin/env bash", *header,
        f"# Written by `megatron-rl slurm submit` at {stamp}; resubmit as it is with `sbatch THIS_FILE`",
        f"# (continuing the run: `megatron-rl slurm submit ... run.resume=latest`). The launcher: {LAUNCHER}",
        *lines, f"set -- {' '.join(shlex.quote(w) for w in overrides)}", *body, ""])


def _beside_python(command: str) -> str:
    """The console script of this installation (so the nodes run the same megatron-rl as the submitter)."""
    here = Path(sys.executable).parent / command
    return str(here) if here.exists() else command


def submit(req: SubmitRequest, dry_run: bool) -> str:
    text, run_dir, plan = prepare(req)
    print(plan)
    print(f"---- sbatch script ({'not submitted: --dry-run' if dry_run else 'submitting'}) ----")
    print(text, end="")
    print("----")
    if dry_run:
        return ""
    if shutil.which("sbatch") is None:
        raise ValueError("sbatch is not on PATH: submit from a Slurm login node (or pass --dry-run to see the script)")
    folder = run_dir / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"submit-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    path.write_text(text)
    out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise ValueError(f"sbatch refused the job ({path}): {out.stderr.strip() or out.stdout.strip()}")
    job = out.stdout.strip().split(";")[0]
    print(f"submitted job {job}\nrun folder: {run_dir}\nlog: {folder}/batch-{job}.log; per node: {folder / job}/ (ray-head-*.log, "
          f"ray-worker-*.log)\nmetrics: {run_dir / 'metrics.jsonl'}")
    return job
