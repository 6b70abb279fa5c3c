"""The update protocol, loop side: connect → receive (senders push while replicas stage; where the send
alone leaves the buckets in the replicas' reach, as CUDA IPC does, the replicas stage at finish) → pause →
finish (verify, load, report version) → resume. Failed replicas are retried on a fresh session, then quarantined;
the fleet resumes only when every replica still serving reports the new version. A replica that the caller's
``lost`` probe names (its node died) is not waited for: calls to it stop being waited on within
``LOST_POLL_S`` and it is quarantined at once, without retries.

A replica that restarts (its process dies and a supervisor starts it again at the same address) comes back
with the checkpoint's weights and no plan or session: a retry waits up to ``rejoin_wait_s`` for it to answer,
sends it the plan again (its workers report none) and brings it to the version of the update, whole."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

from weight_transfer.config import WeightTransferConfig
from weight_transfer.plan import TransferPlan
from weight_transfer.replicas import Replica, ReplicaDown
from weight_transfer.session import new_session
from weight_transfer.transports import receives_after_send

log = logging.getLogger("weight_transfer")

LOST_POLL_S = 5.0
"""While calls wait on replicas longer than this, the ``lost`` probe is asked again every as long."""

LEGS = ("send", "receive", "receive_worker", "pause_call", "finish", "finish_worker", "verify")
"""The legs the metrics report as ``weight_transfer/<leg>_seconds`` (see ``_Attempt.legs``)."""


class Senders(Protocol):
    """The trainer ranks that send (one call fans out to all of them)."""

    def endpoints(self, ranks: list[int]) -> dict[int, tuple[str, int]]:
        """Each of ``ranks``' node address and a free port chosen on that node (where its store will listen)."""

    def connect(self, session: dict) -> None: ...

    def send(self, version: int, digests: bool) -> dict:
        """Every rank sends its buckets; merged ``{"buckets": {index: checksum}, "tensors": {...}}``."""

    def release(self, version: int) -> None: ...

    def disconnect(self) -> None: ...


class WeightTransferError(RuntimeError):
    """The update could not reach every live replica; the message names each failure."""


@dataclass
class _Attempt:
    ok: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)
    sender_error: str | None = None
    finished: bool = False
    """The replicas were asked to finish: the senders' buffers wait for ``Senders.release``."""
    load_seconds: float = 0.0
    paused_at: float | None = None
    legs: dict = field(default_factory=dict)
    """Seconds of the update's legs (:data:`LEGS`): send (the senders' call), receive (the slowest replica's
    receive call) and receive_worker (the longest a worker spent inside it; the rest of the call is the
    RPC's own); then, inside the pause window, pause_call (pausing every replica), finish (the finish
    calls), finish_worker (the longest a worker spent inside its finish: staging where the transport
    stages at finish, verifying, loading) and verify (the longest checksum pass). Transports whose
    receivers stage at finish have no receive legs."""

    def fail(self, replica: Replica, error: str) -> None:
        self.errors[replica.name] = error


class WeightTransferCoordinator:
    """``lost``: returns ``{replica name: why}`` for replicas gone for good (a dead node): such a replica is
    neither waited for (its calls' own timeouts run to ``2 * timeout_s + 30`` s) nor retried."""

    def __init__(self, config: WeightTransferConfig, plan: TransferPlan, replicas: list[Replica], senders: Senders,
                 lost: Callable[[], dict[str, str]] | None = None):
        self.config, self.replicas, self.senders, self.lost = config, list(replicas), senders, lost
        self.gone: dict[str, str] = {}
        self.versions: dict[str, int | None] = {r.name: None for r in replicas}
        self.quarantined: dict[str, str] = {}
        self._session_targets: list[str] | None = None
        self.set_plan(plan)

    def set_plan(self, plan: TransferPlan) -> None:
        """Use a new plan (the layout changed): replicas get it before the next update, sessions restart."""
        self.plan = plan
        self._session_targets = None

    def update(self, version: int) -> dict[str, float]:
        """Move every live replica to ``version``; returns ``weight_transfer/*`` metrics."""
        start, pause_start, retries = time.perf_counter(), None, 0
        failures: dict[str, int] = {}
        stats = {"transfer": 0.0, "load": 0.0}
        attempt = None
        while pending := [r for r in self._live() if self.versions[r.name] != version]:
            attempt, transfer_s = self._attempt(version, pending)
            stats["transfer"] = max(stats["transfer"], transfer_s)
            stats["load"] = max(stats["load"], attempt.load_seconds)
            for leg, seconds in attempt.legs.items():
                stats[leg] = max(stats.get(leg, 0.0), seconds)
            pause_start = pause_start or attempt.paused_at
            for replica in attempt.ok:
                self.versions[replica.name] = version
            if not attempt.errors:
                break
            self._release(version, attempt)
            retries += 1
            self._session_targets = None
            try:
                self._blame(version, attempt, failures)
            except WeightTransferError:
                # every replica holds whole weights (a failed finish loads nothing): serve them; a dead one stays down
                _run_all([(lambda r=r: r.resume()) for r in self._live()])
                raise
            self._await_rejoin([r for r in self._live() if r.name in attempt.errors])
        self._resume(version)
        pause_s = time.perf_counter() - pause_start if pause_start else 0.0
        if attempt is not None:
            self._release(version, attempt)  # once the replicas serve again: outside the pause window
        return self._metrics(start, pause_s, retries, stats)

    def _await_rejoin(self, failed: list[Replica]) -> None:
        """Wait up to ``rejoin_wait_s`` for every replica in ``failed`` that does not answer (restarting)."""
        if self.config.rejoin_wait_s <= 0:
            return
        deadline = time.monotonic() + self.config.rejoin_wait_s
        down = [r for r in failed if not r.healthy()]
        if down:
            log.warning("weight_transfer: waiting up to weight_transfer.rejoin_wait_s=%s s for %s to answer again",
                        self.config.rejoin_wait_s, [r.name for r in down])
        while down and time.monotonic() < deadline:
            time.sleep(0.5)
            down = [r for r in down if not r.healthy()]

    def _release(self, version: int, attempt: _Attempt) -> None:
        if attempt.finished:
            self.senders.release(version)
            attempt.finished = False

    def _attempt(self, version: int, targets: list[Replica]) -> tuple[_Attempt, float]:
        result = _Attempt()
        targets = [r for r in targets if (r.name not in self.gone and r.healthy())
                   or result.fail(r, self.gone.get(r.name, "not healthy (no answer)"))]
        if targets and self._session_targets != [r.name for r in targets]:
            targets = self._connect(targets, result)
        if not targets:
            return result, 0.0
        start = time.perf_counter()
        sent, received = self._transfer(version, targets, result)
        transfer_s = time.perf_counter() - start
        if result.sender_error:
            for replica in targets:
                result.fail(replica, f"senders failed: {result.sender_error}")
            return result, transfer_s
        if received is not None:
            targets = [r for r, answer in zip(targets, received) if self._received(r, answer, result)]
        result.paused_at = time.perf_counter()
        paused = _run_all([(lambda r=r: r.pause(self.config.pause_mode)) for r in targets], self._watch(targets))
        ready = [r for r, out in zip(targets, paused) if not isinstance(out, Exception) or result.fail(r, f"pause: {out}")]
        finish_at = time.perf_counter()
        result.legs["pause_call"] = finish_at - result.paused_at
        self._finish(version, ready, sent, result, receive_at_finish=received is None)
        result.legs["finish"] = time.perf_counter() - finish_at
        result.finished = True
        return result, transfer_s

    def _connect(self, targets: list[Replica], result: _Attempt) -> list[Replica]:
        """Fresh session for ``targets``: plan to replicas that lack it, then senders and workers join together."""
        workers = {}
        for replica in targets:
            try:
                described = replica.call("wt_describe", {"load": self.config.load}, self.config.timeout_s)
                refused = next((d["load_error"] for d in described if d["load_error"]), None)
                if refused:  # a config error, not a replica fault: nothing was sent, every replica keeps serving
                    raise ValueError(f"weight_transfer.load={self.config.load}: replica {replica.name}: {refused}; "
                                     "use weight_transfer.load=auto (direct where valid) or reload")
                log.info("weight_transfer: replica %s loads by %s", replica.name, sorted({d["load"] for d in described}))
                workers[replica.name] = len(described)
                if any(d["plan"] != self.plan.fingerprint for d in described):  # new plan, or a restarted replica
                    replica.call("wt_set_plan", {"plan": self.plan.to_json()}, self.config.timeout_s)
            except ReplicaDown as err:
                result.fail(replica, str(err))
        targets = [r for r in targets if r.name in workers]
        session = new_session(self.config, self.plan, sum(workers.values()), self.senders.endpoints(self.plan.senders))
        log.info("weight_transfer: session %s, senders' stores at %s", session["id"],
                 {r: f"{session['addrs'][r]}:{session['ports'][r]}" for r in session["ports"]})
        bases = [1 + sum(workers[t.name] for t in targets[:i]) for i in range(len(targets))]
        calls = [lambda: self.senders.connect(session)] + [
            (lambda r=r, b=b: r.call("wt_init_transport", {"session": session, "rank_base": b}, self._rpc_timeout))
            for r, b in zip(targets, bases)]
        outcomes = _run_all(calls, self._watch([None] + targets))
        if isinstance(outcomes[0], Exception):
            result.sender_error = f"connect: {outcomes[0]}"
            for replica in targets:
                result.fail(replica, f"senders failed to connect: {outcomes[0]}")
            return []
        joined = [r for r, out in zip(targets, outcomes[1:]) if not isinstance(out, Exception) or result.fail(r, str(out))]
        self._session_targets = [r.name for r in targets] if len(joined) == len(targets) else None
        return joined

    def _transfer(self, version: int, targets: list[Replica], result: _Attempt) -> tuple[dict, list | None]:
        """The senders' call and, beside it, each replica's receive call (None where the replicas receive
        at finish: ``receives_after_send``, the send alone moves the bytes)."""
        digests = self.config.verify == "tensor_equality"
        start, ends = time.perf_counter(), {}

        def send():
            try:
                return self.senders.send(version, digests)
            except Exception as err:  # named now: the replicas may wait out their transport timeout first
                log.error("weight_transfer: senders failed on version %d: %s (replicas wait up to "
                          "weight_transfer.timeout_s=%s s for the buckets)", version, err, self.config.timeout_s)
                raise
            finally:
                ends["send"] = time.perf_counter()

        def receive_on(replica):
            try:
                return replica.call("wt_receive", self._receive_msg(version), self._rpc_timeout)
            finally:
                ends[replica.name] = time.perf_counter()

        if receives_after_send(self.config.resolved_transport.type):
            sent, received = _guarded(send), None
            result.legs = {"send": ends["send"] - start}
        else:
            sent, *received = _run_all([send] + [(lambda r=r: receive_on(r)) for r in targets],
                                       self._watch([None] + targets))
            worker = [a["seconds"] for answer in received if isinstance(answer, list) for a in answer if a.get("ok")]
            returned = time.perf_counter()  # an abandoned call (its replica lost) has no end of its own
            result.legs = {"send": ends["send"] - start,
                           "receive": max(ends.get(r.name, returned) for r in targets) - start,
                           "receive_worker": max(worker, default=0.0)}
        if isinstance(sent, Exception):
            result.sender_error = f"{type(sent).__name__}: {sent}"
        return sent, received

    def _receive_msg(self, version: int) -> dict:
        return {"version": version, "plan": self.plan.fingerprint}

    def _received(self, replica: Replica, answer, result: _Attempt) -> bool:
        if isinstance(answer, Exception):
            result.fail(replica, f"receive: {answer}")
            return False
        bad = [a["error"] for a in answer if not a["ok"]]
        if bad:
            result.fail(replica, f"receive: {bad[0]}")
        return not bad

    def _finish(self, version: int, ready: list[Replica], sent: dict, result: _Attempt, receive_at_finish: bool) -> None:
        expected = {str(k): v for k, v in sent["buckets"].items()}
        msg = {"version": version, "expected": expected, "digests": bool(sent["tensors"])}
        if receive_at_finish:
            msg["receive"] = self._receive_msg(version)
        answers = _run_all([(lambda r=r: r.call("wt_finish", msg, self._rpc_timeout)) for r in ready],
                           self._watch(ready))
        for replica, answer in zip(ready, answers):
            error = self._check_report(version, answer, expected, sent["tensors"])
            if error:
                result.fail(replica, error)
            else:
                result.ok.append(replica)
                result.load_seconds = max([result.load_seconds] + [a["load_seconds"] for a in answer])
                for leg, key in (("finish_worker", "seconds"), ("verify", "verify_seconds")):
                    result.legs[leg] = max([result.legs.get(leg, 0.0)] + [a[key] for a in answer])

    @staticmethod
    def _check_report(version: int, answer, expected: dict, digests: dict) -> str | None:
        if isinstance(answer, Exception):
            return f"finish: {answer}"
        for worker, report in enumerate(answer):
            if not report["ok"]:
                return f"worker {worker}: {report['error']}"
            if report["version"] != version or report["checksums"] != expected:
                wrong = sorted(k for k in expected if report["checksums"].get(k) != expected[k])
                return f"worker {worker} reports version {report['version']}, wrong bucket checksums {wrong}"
            wrong = sorted(n for n in digests if report["tensors"].get(n) != digests[n])
            if wrong:
                return f"worker {worker}: tensors differ after transfer: {wrong[:10]}"
        return None

    @property
    def _rpc_timeout(self) -> float:
        """RPC limit for blocking receiver calls: longer than the transport's own, so the transport names the fault."""
        return 2 * self.config.timeout_s + 30

    def _watch(self, peers: list[Replica | None]) -> Callable[[], dict[int, str]] | None:
        """The ``gone`` probe of ``_run_all`` for calls that wait on ``peers`` (None: a sender's call)."""
        if self.lost is None:
            return None

        def gone() -> dict[int, str]:
            self.gone.update(self.lost())
            return {i: f"{p.name}: {self.gone[p.name]}" for i, p in enumerate(peers)
                    if p is not None and p.name in self.gone}
        return gone

    def _live(self) -> list[Replica]:
        return [r for r in self.replicas if r.name not in self.quarantined]

    def _blame(self, version: int, attempt: _Attempt, failures: dict[str, int]) -> None:
        for name, error in attempt.errors.items():
            log.error("weight_transfer: version %d to replica %s failed: %s", version, name, error)
        if attempt.sender_error and not attempt.ok:
            failures["senders"] = failures.get("senders", 0) + 1
            if failures["senders"] > self.config.max_retries:
                raise WeightTransferError(f"version {version}: senders failed {failures['senders']} times, last: "
                                          f"{attempt.sender_error}; replicas keep their versions {self.versions}")
            return
        for name in attempt.errors:
            failures[name] = failures.get(name, 0) + 1
            if name in self.gone:
                self._quarantine(name, f"{self.gone[name]}; {attempt.errors[name]}")
            elif failures[name] > self.config.max_retries:
                self._quarantine(name, attempt.errors[name])

    def _quarantine(self, name: str, reason: str) -> None:
        replica = next(r for r in self.replicas if r.name == name)
        self.quarantined[name] = reason
        log.error("weight_transfer: quarantining replica %s: %s", name, reason)
        replica.quarantine(reason)

    def _resume(self, version: int) -> None:
        live = self._live()
        behind = {r.name: self.versions[r.name] for r in live if self.versions[r.name] != version}
        assert not behind, f"resuming with replicas behind version {version}: {behind}"
        _each(live, lambda r: r.resume())

    def _metrics(self, start: float, pause_s: float, retries: int, stats: dict) -> dict[str, float]:
        seconds = time.perf_counter() - start
        nbytes = self.plan.nbytes
        return {"weight_transfer/seconds": seconds,
                "weight_transfer/transfer_seconds": stats["transfer"],
                **{f"weight_transfer/{leg}_seconds": stats.get(leg, 0.0) for leg in LEGS},
                "weight_transfer/load_seconds": stats["load"],
                "weight_transfer/bytes": float(nbytes),
                "weight_transfer/gb_per_s": nbytes / stats["transfer"] / 1e9 if stats["transfer"] else 0.0,
                "weight_transfer/pause_seconds": pause_s,
                "weight_transfer/buckets": float(len(self.plan.buckets)),
                "weight_transfer/retries": float(retries),
                "weight_transfer/quarantined": float(len(self.quarantined))}


# Threads are started on demand and kept idle between updates: a new pool per call cost 0.1-0.3 ms, a
# tenth of a 1B model's cuda_ipc transfer. The bound only has to exceed the calls of one _run_all (senders
# plus replicas) times the coordinators running at once: every call of a batch must run concurrently.
_POOL = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="weight_transfer")


def _guarded(call):
    """``call()``'s return value, or the exception it raised."""
    try:
        return call()
    except Exception as err:  # reported per call; the coordinator decides whom to blame
        return err


def _run_all(calls: list, gone: Callable[[], dict[int, str]] | None = None) -> list:
    """Run ``calls`` concurrently; each result is its return value or the exception it raised. ``gone``, asked
    every ``LOST_POLL_S`` while calls run, names calls whose peer is lost for good: they are not waited for
    (their threads end at their own timeouts) and give ``ReplicaDown``."""
    futures = [_POOL.submit(_guarded, call) for call in calls]
    abandoned: dict[int, Exception] = {}
    while gone is not None:
        pending = [f for i, f in enumerate(futures) if i not in abandoned and not f.done()]
        if not pending or not wait(pending, timeout=LOST_POLL_S).not_done:
            break
        for i, why in gone().items():
            if not futures[i].done():
                abandoned.setdefault(i, ReplicaDown(why))
    return [abandoned[i] if i in abandoned else f.result() for i, f in enumerate(futures)]


def _each(replicas: list[Replica], call) -> None:
    for outcome in _run_all([(lambda r=r: call(r)) for r in replicas]):
        if isinstance(outcome, Exception):
            raise outcome
