"""Atomic run checkpoints: trainer state plus the loop's own state (step, data position, versions).

A checkpoint is written into ``step_<N>.tmp``, renamed to ``step_<N>`` when complete, and only then
is the tracker file rewritten (itself atomically). A run killed mid-save leaves the tracker on the
previous checkpoint, which still loads; the stray ``.tmp`` folder is removed by the next save.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

TRACKER = "latest_checkpointed_step.txt"
LOOP_STATE = "loop_state.json"


def save_checkpoint(root: Path, step: int, write_trainer: Callable[[Path], None], loop_state: dict, keep: int) -> Path:
    """Write ``write_trainer(dir)`` and ``loop_state`` as checkpoint ``step``; keep the newest ``keep``."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("step_*.tmp"):
        shutil.rmtree(stale)
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp"
    tmp.mkdir()
    write_trainer(tmp / "trainer")
    (tmp / LOOP_STATE).write_text(json.dumps(loop_state, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _write_atomic(root / TRACKER, str(step))
    _prune(root, keep)
    return final


def latest_checkpoint(root: Path) -> tuple[Path, dict] | None:
    """The checkpoint the tracker names and its loop state, or None if there is none."""
    tracker = root / TRACKER
    if not tracker.exists():
        return None
    path = root / f"step_{int(tracker.read_text().strip())}"
    if not (path / LOOP_STATE).exists():
        raise ValueError(f"run.resume=latest: tracker {tracker} names {path}, which is incomplete or missing")
    return path, json.loads((path / LOOP_STATE).read_text())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _prune(root: Path, keep: int) -> None:
    steps = sorted((int(p.name.split("_")[1]) for p in root.glob("step_*") if p.name.split("_")[1].isdigit()))
    for step in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(root / f"step_{step}")
