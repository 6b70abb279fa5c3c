"""Run a function on N fresh processes joined by torch.distributed (gloo on CPU), torchtitan-style.

Each rank runs in a spawned interpreter (megatron keeps global state, and the CPU layer patches
torch), writes its return value with ``torch.save``, and the parent returns them in rank order.
"""

from __future__ import annotations

import socket
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, out_dir: str, fn, args) -> None:
    try:
        result = fn(rank, world, f"tcp://127.0.0.1:{port}", *args)
    except BaseException:
        Path(out_dir, f"error{rank}.txt").write_text(traceback.format_exc())
        raise
    torch.save(result, Path(out_dir, f"rank{rank}.pt"))


def start_ranks(fn, world: int, out_dir: Path, *args) -> list:
    """Start ``fn(rank, world, init_method, *args)`` on ``world`` spawned processes; return them."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, str(out_dir), fn, args)) for r in range(world)]
    for p in procs:
        p.start()
    return procs


def run_ranks(fn, world: int, out_dir: Path, *args, timeout: float = 240.0) -> list:
    """``fn(rank, world, init_method, *args)`` on ``world`` processes; their results in rank order."""
    procs = start_ranks(fn, world, out_dir, *args)
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    errors = sorted(out_dir.glob("error*.txt"))
    if errors:
        raise AssertionError(errors[0].read_text())
    if any(p.exitcode != 0 for p in procs):
        raise AssertionError(f"rank exit codes {[p.exitcode for p in procs]}")
    return [torch.load(Path(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]
