"""Trainer ranks as local processes (single-host runs, CPU tests, benchmarks): each process owns one trainer
rank, gets its (hf_name, tensor) pairs from ``weights_fn(rank, version)`` and runs ``send_weights``; ranks the
plan gives no bucket still run their export (its gathers need them) but hold no transport."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable, Iterable

import torch

from weight_transfer.plan import TransferPlan
from weight_transfer.sender import send_weights
from weight_transfer.session import local_endpoints
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
                transport = None
                if str(rank) in args[0]["ports"]:  # the session lists the ranks that send
                    transport = make_sender(args[0], rank, device)
                    transport = wrap(transport) if wrap else transport
                conn.send(("ok", None))
            elif command == "send":
                version, digests = args
                conn.send(("ok", send_weights(plan, rank, weights_fn(rank, version), transport, version,
                                              device, digests)))
            elif command == "release":
                if transport is not None:
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
    """One spawned process per trainer rank in ``ranks`` (default: the plan's senders; buffers on ``device``);
    a dead process is replaced on the next ``connect``.
    ``wrap(transport)`` may wrap each rank's transport (e.g. to trace, or to inject faults in tests)."""

    def __init__(self, plan: TransferPlan, weights_fn: WeightsFn, wrap=None, device: str = "cpu",
                 ranks: list[int] | None = None):
        self.plan, self.weights_fn, self.wrap, self.device = plan, weights_fn, wrap, device
        self.ranks = sorted(ranks) if ranks is not None else plan.senders
        if not set(plan.senders) <= set(self.ranks):
            raise ValueError(f"LocalSenders: ranks {self.ranks} lack the plan's senders {plan.senders}")
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

    def endpoints(self, ranks: list[int]) -> dict[int, tuple[str, int]]:
        return local_endpoints(ranks)  # every rank is a process on this host

    def connect(self, session: dict) -> None:
        for rank in self.ranks:
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
