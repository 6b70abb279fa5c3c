"""The console: known warnings filtered (in-process and through PYTHONWARNINGS), step clock, summary, curves."""

import os
import subprocess
import sys

from megatron_rl.console import StepClock, python_warnings
from megatron_rl.run_summary import summary_lines
from megatron_rl.tracking import PANELS, plot_curves

EMIT = ("import warnings; {setup}"
        "warnings.warn('Apex is not installed. Falling back to Torch Norm'); "
        "warnings.warn('MimoModelConfig is experimental and still under active development'); "
        "warnings.warn('barrier(): using the device under current context. You can specify device_id'); "
        "warnings.warn('invalid escape sequence', SyntaxWarning); "
        "warnings.warn('something new the user must see')")


def _stderr(code: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return done.stderr


def test_quiet_process_drops_known_warnings_and_keeps_others():
    err = _stderr(EMIT.format(setup="from megatron_rl.console import quiet_process; quiet_process(); "))
    assert "something new the user must see" in err
    assert "Apex" not in err and "Mimo" not in err and "barrier" not in err and "escape" not in err


def test_child_processes_inherit_the_filters_through_pythonwarnings():
    env = {**os.environ, "PYTHONWARNINGS": python_warnings("")}
    err = _stderr(EMIT.format(setup=""), env)
    assert "Invalid -W option" not in err  # every entry parses
    assert "something new the user must see" in err
    assert "Apex" not in err and "Mimo" not in err and "barrier" not in err and "escape" not in err
    assert python_warnings("error::DeprecationWarning").startswith("error::DeprecationWarning,ignore:")


def test_step_clock_counts_time_left_from_the_last_step_zero_line():
    times = iter([100.0, 160.0, 190.0, 250.0])  # SFT line at step 0, eval line at step 0, then steps 1 and 3
    clock = StepClock(total=5, now=lambda: next(times))
    assert clock.tag(0) == "[0/5]"
    assert clock.tag(0) == "[0/5]"
    assert clock.tag(1) == "[1/5, 2:00 left]"  # 30 s per step, 4 left
    assert clock.tag(3) == "[3/5, 1:00 left]"  # (250-160)/3 = 30 s per step, 2 left


def test_summary_reads_eval_before_after_best_and_phases(tmp_path):
    records = [{"step": 0, "eval/pass_rate": 0.25},
               *({"step": s, "reward/mean": 0.1 * s, "timing/generate": 2.0, "timing/train": 1.0} for s in range(1, 7)),
               {"step": 3, "eval/pass_rate": 0.5, "timing/eval": 4.0},
               {"step": 6, "eval/pass_rate": 0.45, "timing/eval": 4.0}]
    (tmp_path / "checkpoints").mkdir()
    lines = summary_lines(records, {"sft": 65.0, "rl": 30.0, "total": 125.0}, tmp_path, tmp_path / "curves.png")
    assert lines[0] == "eval pass rate: 0.250 (step 0) -> 0.450 (step 6), +20.0 points; best 0.500 at step 3"
    assert lines[1] == "train reward: 0.300 (first 5 steps) -> 0.400 (last 5)"  # mean(.1..0.5), mean(.2..0.6)
    assert lines[2] == "wall time: sft 1:05, rl 0:30, total 2:05 (RL steps: generate 0:12, train 0:06, eval 0:08)"
    assert lines[-1] == f"checkpoints: {tmp_path / 'checkpoints'}"


def test_curves_have_a_panel_per_quantity(tmp_path):
    records = [{"step": s, "reward/mean": 0.1 * s, "policy/entropy": 1.0} for s in range(1, 4)]
    out = plot_curves(records, tmp_path / "curves.png")
    assert out.stat().st_size > 10_000
    assert len(PANELS) == 6 and len({key for key, _ in PANELS}) == 6


def test_quiet_process_drops_ray_and_transformers_notices(tmp_path):
    """Ray's token-authentication notice (printed by every local ``ray.init``) and transformers' "Writing model
    shards" bar (as the tiny model is saved) were the first two lines of the default run."""
    code = ("import logging; logging.basicConfig(); from megatron_rl.console import quiet_process; quiet_process(); "
            "from ray._private.authentication import authentication_token_setup as a; a._warn_token_auth_enabled(); "
            "import transformers; m = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=64, "
            "hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)); "
            f"m.save_pretrained({str(tmp_path)!r}); logging.getLogger('megatron_rl').warning('still shown'); "
            "mc = logging.getLogger('megatron.core.dist_checkpointing.strategies.torch'); "
            "mc.warning('MCore' + chr(39) + 's async save is deprecated and will be removed'); mc.warning('shown too')")
    err = _stderr(code)
    assert "still shown" in err and "shown too" in err and "async save" not in err
    assert "Token authentication" not in err and "Writing model shards" not in err


def test_sigterm_stops_the_driver_without_a_native_stack_dump():
    """Ray's core worker chains a native failure handler in front of its SIGTERM handler; a stopped run printed
    its "*** SIGTERM received ..." stack dump above the summary. The driver still exits as Ray's handler would."""
    code = ("import os, signal; from megatron_rl import console; console.setup(verbose=False)\n"
            "try:\n    os.kill(os.getpid(), signal.SIGTERM); signal.pause()\n"
            "finally:\n    print('finally ran', flush=True)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 15 and "finally ran" in done.stdout, done.stdout + done.stderr
    assert "SIGTERM received" not in done.stderr and "@ 0x" not in done.stderr, done.stderr
