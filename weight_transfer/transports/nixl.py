"""NIXL pull: each sender rank registers its bucket buffers with a NIXL agent (UCX backend: GPU memory on
GPU machines, DRAM on CPU) and publishes the agent's metadata and one descriptor per packed bucket in a
small rendezvous store it hosts; every inference worker reads the buckets it needs straight from the
sender that owns them (an RDMA READ; no gather on rank 0, no receiver rank waits for another).

Registrations are made once per plan and reused by every version and session: a sender packs each version
into the same registered buffers (as CUDA IPC does; safe because the coordinator releases version v on
both sides before it asks for v+1), and a receiver pulls into the same registered destination buffers.
Only the store, the remote agents' metadata and the transfer handles are per session (a respawned
sender is a new agent). Transfer handles are made once per session and bucket and posted again for each
version.

A worker posts each bucket's READ as soon as the sender has published it (right after packing it), so
pulls overlap the sender's packing of the next buckets; it yields them in plan order as they complete. A
sender that dies mid-pull shows as a failed transfer or a key that never comes: the receive fails, and
the replica keeps its weights.

On the CPU machines here two processes' agents moved 256 MiB at 1.3-2.4 GB/s (memcpy 2.8 GB/s in the
same run, shared_memory-style UCX transports between processes of one host). On an H200 the UCX inside the
nixl-cu12 1.5.1 wheel refused to register GPU memory ("VRAM memory is detected as host by UCX. UCX is likely
not configured with CUDA/ROCm support"): GPU pulls need a NIXL whose UCX has CUDA support; with the wheel this
transport says so when it registers its first GPU buffer.
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
from collections.abc import Iterator, Sequence

import torch

from weight_transfer.buckets import Bucket
from weight_transfer.transports.base import ReceiverTransport, SenderTransport, TransportError, sender_store

_AGENTS: dict[str, object] = {}
"""role -> this process's NIXL agent for that role (sender, receiver), made on first use."""

_REGISTERED: dict[tuple[str, str, int], torch.Tensor] = {}
"""(role, plan fingerprint, bucket index) -> the registered buffer. Dropped (deregistered) when the plan changes."""

REGISTRATIONS = {"sender": 0, "receiver": 0}
"""How many buffers this process registered, per role (registrations are reused across versions and sessions)."""


def _agent(role: str):
    if role not in _AGENTS:
        try:
            from nixl_cu12._api import nixl_agent, nixl_agent_config
        except ImportError as err:
            raise ValueError("weight_transfer.transport.type=nixl needs NIXL: pip install 'megatron-rl[rdma]' "
                             "(nixl-cu12)") from err
        _AGENTS[role] = nixl_agent(f"wt-{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}", nixl_agent_config(backends=["UCX"]))
    return _AGENTS[role]


def _registered(role: str, plan: str, bucket: Bucket, device: torch.device) -> torch.Tensor:
    """The registered buffer of ``bucket`` (made and registered once per plan)."""
    stale = [k for k in _REGISTERED if k[0] == role and k[1] != plan]
    agent = _agent(role)
    for key in stale:
        agent.deregister_memory(agent.get_reg_descs([_REGISTERED.pop(key)]))
    key = (role, plan, bucket.index)
    flat = _REGISTERED.get(key)
    if flat is None or flat.numel() != bucket.nbytes or flat.device != device:
        if flat is not None:
            agent.deregister_memory(agent.get_reg_descs([flat]))
        flat = torch.zeros(bucket.nbytes, dtype=torch.uint8, device=device)
        try:
            agent.register_memory([flat])
        except Exception as err:  # nixl's own error types; the UCX log line above it says why
            if not flat.is_cuda:
                raise
            raise TransportError(
                f"nixl: UCX could not register GPU memory ({type(err).__name__}: {err}). The nixl-cu12 wheel's "
                "UCX is built without CUDA (seen on an H200: 'VRAM memory is detected as host'): GPU pulls need "
                "a NIXL whose UCX has CUDA support; else set weight_transfer.transport.type=cuda_ipc (same GPU) "
                "or broadcast (other GPUs)") from err
        _REGISTERED[key] = flat
        REGISTRATIONS[role] += 1
    return flat


class NixlSender(SenderTransport):
    """Agent metadata carries the registrations, so it is published once they exist: at the session's start
    when this process registered the plan's buffers before (every later version), else at the first
    ``finish`` (the plan's first version: buffers are registered as they are packed). Each bucket's key
    names the metadata generation its pull needs."""

    def __init__(self, session: dict, rank: int, device: torch.device):
        self.plan, self.rank = session["plan"], rank
        self.agent = _agent("sender")
        self.store = sender_store("nixl", session, rank, is_master=True)
        self.descs: dict[int, bytes] = {}
        self.generation, self.published = -1, None
        if any(k[0] == "sender" and k[1] == self.plan for k in _REGISTERED):
            self._publish()

    def _publish(self) -> None:
        self.generation += 1
        self.store.set(f"agent/{self.generation}", self.agent.get_agent_metadata())
        self.published = REGISTRATIONS["sender"]

    def buffer(self, bucket: Bucket, device: torch.device) -> torch.Tensor:
        return _registered("sender", self.plan, bucket, device)

    def send(self, version: int, bucket: Bucket, flat: torch.Tensor) -> None:
        if _REGISTERED.get(("sender", self.plan, bucket.index)) is not flat:
            raise TransportError(f"nixl: bucket {bucket.index} was not packed into this transport's registered buffer")
        if flat.is_cuda:
            torch.cuda.current_stream(flat.device).synchronize()  # packed before any reader may pull
        desc = self.descs.get(bucket.index)
        if desc is None:
            desc = self.descs[bucket.index] = self.agent.get_serialized_descs(self.agent.get_xfer_descs([flat]))
        needs = self.generation if self.published == REGISTRATIONS["sender"] else self.generation + 1
        self.store.set(f"v{version}/b{bucket.index}", pickle.dumps((needs, desc)))

    def finish(self, version: int) -> None:
        if self.published != REGISTRATIONS["sender"]:
            self._publish()

    def close(self) -> None:
        self.store, self.descs = None, {}


class NixlReceiver(ReceiverTransport):
    def __init__(self, session: dict, rank: int, device: torch.device):
        self.session, self.plan, self.device = session, session["plan"], device
        self.agent = _agent("receiver")
        self.stores = {int(s): sender_store("nixl", session, int(s), is_master=False) for s in session["ports"]}
        self.remotes: dict[int, tuple[int, str]] = {}  # sender -> (metadata generation, remote agent name)
        self.handles: dict[int, tuple] = {}  # bucket -> (remote descriptor, transfer handle, remote prepped list, sender)
        self.local: dict[int, object] = {}

    def _remote(self, sender: int, generation: int) -> str:
        """The sender's agent as this worker knows it, with metadata of at least ``generation``."""
        known = self.remotes.get(sender)
        if known is None or known[0] < generation:
            if known is not None:  # newer registrations: load the metadata again, remake this sender's pulls
                self.handles = {i: h for i, h in self.handles.items() if h[3] != sender}
                self.agent.remove_remote_agent(known[1])
            try:
                name = self.agent.add_remote_agent(self.stores[sender].get(f"agent/{generation}"))
            except RuntimeError as err:
                raise TransportError(f"nixl: no agent metadata from sender {sender}: {err}") from err
            known = self.remotes[sender] = (generation, name)
        return known[1]

    def _handle(self, bucket: Bucket, published: bytes):
        generation, desc = pickle.loads(published)
        name = self._remote(bucket.sender, generation)
        known = self.handles.get(bucket.index)
        if known is not None and known[0] == desc:
            return known[1]
        dest = _registered("receiver", self.plan, bucket, self.device)
        if bucket.index not in self.local:
            self.local[bucket.index] = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", self.agent.get_xfer_descs([dest]))
        remote = self.agent.prep_xfer_dlist(name, self.agent.deserialize_descs(desc))
        handle = self.agent.make_prepped_xfer("READ", self.local[bucket.index], [0], remote, [0])
        self.handles[bucket.index] = (desc, handle, remote, bucket.sender)  # the prepped list outlives the handle
        return handle

    def receive(self, version: int, buckets: Sequence[Bucket]) -> Iterator[tuple[Bucket, torch.Tensor]]:
        posted = []
        for bucket in buckets:  # post each pull as soon as its sender has packed the bucket
            try:
                desc = self.stores[bucket.sender].get(f"v{version}/b{bucket.index}")
            except RuntimeError as err:
                raise TransportError(f"nixl: bucket {bucket.index} of version {version} was not published by sender "
                                     f"{bucket.sender} within {self.session['timeout_s']} s: {err}") from err
            handle = self._handle(bucket, desc)
            if self.agent.transfer(handle) == "ERR":
                raise TransportError(f"nixl: posting the pull of bucket {bucket.index} from sender {bucket.sender} failed")
            posted.append((bucket, handle))
        deadline = time.monotonic() + self.session["timeout_s"]
        for bucket, handle in posted:
            while (state := self.agent.check_xfer_state(handle)) == "PROC":
                if time.monotonic() > deadline:
                    raise TransportError(f"nixl: pulling bucket {bucket.index} from sender {bucket.sender} took over "
                                         f"{self.session['timeout_s']} s")
                time.sleep(0)
            if state != "DONE":
                raise TransportError(f"nixl: pulling bucket {bucket.index} of version {version} from sender "
                                     f"{bucket.sender} failed ({state}; sender gone?)")
            yield bucket, _REGISTERED[("receiver", self.plan, bucket.index)]

    def close(self) -> None:
        for _, handle, _, _ in self.handles.values():
            try:
                handle.release()
            except Exception:  # a handle whose peer died may refuse release; the agent frees it at exit
                pass
        for _, name in self.remotes.values():
            try:
                self.agent.remove_remote_agent(name)
            except Exception:
                pass
        self.handles, self.remotes, self.local, self.stores = {}, {}, {}, {}
