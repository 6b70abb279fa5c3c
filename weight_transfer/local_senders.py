"""Sender ranks as local processes (single-host runs, CPU tests, benchmarks): each process owns one trainer
rank, gets its (hf_name, tensor) pairs from ``weights_fn(rank, version)`` and runs ``send_weights``."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable, Iterable

import torch

from weight_transfer.plan import TransferPlan
from weight_transfer.sender import send_weights
from weight_transfer.transports import TransportError, make_sender

WeightsFn = Callable[[int, int], Iterable[tuple[str, torch.Tensor]]]


def _serve(conn, plan_json: str, rank: int, weights_fn: WeightsFn, wrap, device: str) -> None:
    plan, transport, device = TransferPlan.from_json(plan_json), None, torch.device(device)
    while True:
        command, *args = conn.recv()
        try:
            if command == "connect":
                if transport is not None:
                    transport.close()
                transport = make_sender(args[0], rank, device)
                transport = wrap(transport) if wrap else transport
                conn.send(("ok", None))
            elif command == "send":
                version, digests = args
                conn.send(("ok", send_weights(plan, rank, weights_fn(rank, version), transport, version,
                                              device, digests)))
            elif command == "release":
                transport.release(args[0])
                conn.send(("ok", None))
            else:
                if transport is not None:
                    transport.close()
                conn.send(("ok", None))
                return
        except Exception:
            conn.send(("error", traceback.format_exc(limit=4)))


class LocalSenders:
    """One spawned process per sender rank of ``plan`` (buffers on ``device``); a dead process is replaced
    on the next ``connect``.
    ``wrap(transport)`` may wrap each rank's transport (e.g. to trace, or to inject faults in tests)."""

    def __init__(self, plan: TransferPlan, weights_fn: WeightsFn, wrap=None, device: str = "cpu"):
        self.plan, self.weights_fn, self.wrap, self.device = plan, weights_fn, wrap, device
        self.ctx = mp.get_context("spawn")
        self.procs: dict[int, tuple] = {}

    def _spawn(self, rank: int) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_serve, args=(child, self.plan.to_json(), rank, self.weights_fn, self.wrap, self.device),
                                daemon=True, name=f"wt-sender-{rank}")
        proc.start()
        self.procs[rank] = (proc, parent)

    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, (proc, _) in self.procs.items()}

    def _all(self, *command) -> dict[int, object]:
        for _, conn in self.procs.values():
            try:
                conn.send(command)
            except (BrokenPipeError, ConnectionError):
                pass  # reported below as a dead rank
        results, errors = {}, []
        for rank, (proc, conn) in self.procs.items():
            try:
                status, value = conn.recv()
            except (EOFError, ConnectionError):
                errors.append(f"sender rank {rank} died (exit code {proc.join(5) or proc.exitcode})")
                continue
            if status == "error":
                errors.append(f"sender rank {rank}: {value}")
            results[rank] = value
        if errors:
            raise TransportError("; ".join(errors))
        return results

    def connect(self, session: dict) -> None:
        for rank in self.plan.senders:
            if rank not in self.procs or not self.procs[rank][0].is_alive():
                self._spawn(rank)
        self._all("connect", session)

    def send(self, version: int, digests: bool) -> dict:
        merged = {"buckets": {}, "tensors": {}}
        for result in self._all("send", version, digests).values():
            merged["buckets"].update(result["buckets"])
            merged["tensors"].update(result["tensors"])
        return merged

    def release(self, version: int) -> None:
        self._all("release", version)

    def disconnect(self) -> None:
        for rank, (proc, conn) in list(self.procs.items()):
            if proc.is_alive():
                conn.send(("close",))
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        self.procs = {}
