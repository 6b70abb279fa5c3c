"""``megatron-rl slurm submit`` without Slurm: the flags a user can get wrong, the script it writes (header from
the flags, overrides, run folder made absolute), the placement check, and wait-nodes' report of missing nodes."""

from __future__ import annotations

import re

import pytest

from megatron_rl.cli import main
from megatron_rl.launch.ray_wait import node_report
from megatron_rl.launch.slurm import SubmitRequest, prepare, time_limit_s

PLACED = ["placement.servers=ray", "+placement.trainer_resources.slurm_node_0=1",
          "+placement.server_resources.slurm_node_1=1"]


def _req(tmp_path, *words: str, **kw) -> SubmitRequest:
    base = dict(nodes=2, gpus_per_node=0, time="30")
    base.update(kw)
    return SubmitRequest(["recipe=tiny_cpu", f"run.output_dir={tmp_path}", *PLACED, *words], **base)


@pytest.mark.parametrize("text, seconds", [("10", 600), ("10:30", 630), ("4:00:00", 14400), ("1-2", 93600),
                                           ("1-2:30", 95400), ("2-00:00:10", 172810)])
def test_slurm_time_formats(text, seconds):
    assert time_limit_s(text) == seconds


@pytest.mark.parametrize("field, value, named", [
    ("nodes", 0, "--nodes"), ("gpus_per_node", -1, "--gpus-per-node"), ("time", "4h", "--time"), ("time", "0", "--time"),
    ("env", ["NO_EQUALS"], "--env"), ("node_setup", "/no/such/file.sh", "--node-setup"), ("ray_wait_s", 0, "--ray-wait-s"),
])
def test_each_bad_flag_fails_naming_it(tmp_path, field, value, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        prepare(_req(tmp_path, **{field: value}))


def test_script_header_settings_and_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    req = _req(tmp_path, "schedule.total_steps=3", time="2:00:00", partition="batch", account="proj",
               env=["NCCL_DEBUG=WARN"], sbatch_args=["--qos=high"])
    req.overrides[1] = "run.output_dir=rel/out"  # relative to where submit runs: made absolute for the nodes
    text, run_dir, plan = prepare(req)
    assert run_dir == tmp_path / "rel" / "out" / "tiny_cpu"
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert header == ["#SBATCH --job-name=mrl-tiny_cpu", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                      "#SBATCH --exclusive", "#SBATCH --time=2:00:00",
                      f"#SBATCH --output={run_dir}/slurm/batch-%j.log", "#SBATCH --signal=B:USR1@300",
                      "#SBATCH --partition=batch", "#SBATCH --account=proj", "#SBATCH --qos=high"]
    assert f"export MRL_RUN_DIR={run_dir}" in text and "export NCCL_DEBUG=WARN" in text
    assert re.search(rf"^set -- recipe=tiny_cpu .*schedule.total_steps=3 run.output_dir={tmp_path}/rel/out$", text, re.M)
    assert text.index("set -- ") < text.index("set -euo pipefail")  # the launcher's body follows the settings
    assert "inference  1 bundle(s) x 0 GPU  node1: #0" in plan


def test_gpus_and_container_reach_the_script(tmp_path):
    req = _req(tmp_path, gpus_per_node=8, container_image="nvcr.io#org/megatron-rl:1", container_mounts="/lustre:/lustre")
    text, _, plan = prepare(req)
    assert "#SBATCH --gpus-per-node=8" in text
    assert "export MRL_CONTAINER_IMAGE='nvcr.io#org/megatron-rl:1'" in text
    assert "export MRL_MEGATRON_RL=megatron-rl" in text  # the image's own command, not this machine's path
    assert "export MRL_CONTAINER_MOUNTS=/lustre:/lustre" in text
    assert "on 2 node(s) x 8 H100" in plan


def test_a_placement_that_does_not_fit_the_allocation_fails_before_submitting(tmp_path):
    with pytest.raises(ValueError, match=r"no node carries \{'slurm_node_1': 1\}"):
        prepare(_req(tmp_path, nodes=1))


def test_an_existing_run_needs_resume(tmp_path):
    (tmp_path / "tiny_cpu").mkdir()
    (tmp_path / "tiny_cpu" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="run.resume=latest"):
        prepare(_req(tmp_path))
    prepare(_req(tmp_path, "run.resume=latest"))


def test_cli_dry_run_prints_the_script_and_submits_nothing(tmp_path, capsys):
    code = main(["slurm", "submit", "recipe=tiny_cpu", "--nodes", "2", "--gpus-per-node", "0", "--time", "30",
                 f"run.output_dir={tmp_path}", *PLACED, "--dry-run"])  # overrides before and after the flags
    out = capsys.readouterr().out
    assert code == 0 and "not submitted: --dry-run" in out and "#SBATCH --nodes=2" in out
    assert not (tmp_path / "tiny_cpu").exists()


def test_cli_bad_time_is_one_line(capsys):
    assert main(["slurm", "submit", "--nodes", "1", "--gpus-per-node", "0", "--time", "soon", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("megatron-rl slurm: error: --time: 'soon'") and "\n" not in err


def _node(index: int, gpus: float = 0, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": 2.0, "GPU": gpus, f"slurm_node_{index}": 1000.0}}


def test_node_report_names_missing_dead_and_short_nodes():
    names = ["gpu01", "gpu02", "gpu03", "gpu04"]
    nodes = [_node(0, 8), _node(1, 4), _node(2, 8, alive=False)]
    assert node_report(nodes, names, 8) == ["gpu02 (slurm_node_1) joined with 4 GPU(s), expected 8",
                                            "gpu03 (slurm_node_2) has not joined", "gpu04 (slurm_node_3) has not joined"]
    assert node_report([_node(i, 8) for i in range(4)], names, 8) == []
