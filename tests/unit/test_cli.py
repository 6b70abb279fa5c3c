"""The command line: help lists the commands; errors exit 2 with the key named."""

import subprocess
import sys

from megatron_rl.cli import main


def run_cli(*words):
    return subprocess.run([sys.executable, "-m", "megatron_rl.cli", *words], capture_output=True, text=True)


def test_help_lists_the_commands():
    out = run_cli("--help")
    assert out.returncode == 0
    for command in ("make-tiny-model", "config"):
        assert command in out.stdout


def test_config_error_exits_2_and_names_the_key(capsys):
    assert main(["config", "run.sed=1"]) == 2
    assert "run.sed" in capsys.readouterr().err


def test_config_prints_the_resolved_yaml(capsys):
    assert main(["config", "run.seed=5"]) == 0
    assert "seed: 5" in capsys.readouterr().out


def test_serve_training_without_the_tinker_sdk_names_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tinker.proto", None)  # as if the SDK were not installed
    assert main(["serve-training", "model=/nonexistent"]) == 2
    assert ".[tinker]" in capsys.readouterr().err
