"""Weight-transfer config: bucket size, transport (discriminated by ``type``), pause, verification, retries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal

PAUSE_MODES = ("keep", "abort", "wait")
VERIFY_MODES = ("bucket_checksum", "tensor_equality")
LOAD_MODES = ("auto", "reload", "direct")


@dataclass
class BroadcastConfig:
    """One process group per sender rank spanning it and every inference worker (NCCL on GPU, gloo on CPU)."""

    type: Literal["broadcast"] = "broadcast"
    master_addr: str = "auto"
    """Where the inference workers reach the sender ranks' rendezvous stores: auto (each sender's own node
    address, as it reports it), or one address for every sender (e.g. behind a NAT)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend: auto picks nccl when the buffers are on CUDA, gloo otherwise."""

    def __post_init__(self):
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"weight_transfer.transport.backend={self.backend!r}: use auto, gloo or nccl")


@dataclass
class SharedMemoryConfig:
    """Colocated on one host: each bucket is a file in a RAM-backed folder that receivers map without copying."""

    type: Literal["shared_memory"] = "shared_memory"
    dir: str = "/dev/shm"
    """RAM-backed folder for bucket files (one file per bucket and version)."""


@dataclass
class CudaIpcConfig:
    """Colocated on the same GPUs: one CUDA IPC handle per bucket, the receiver maps it without copying."""

    type: Literal["cuda_ipc"] = "cuda_ipc"


@dataclass
class TensorstoreDeltaConfig:
    """Fleets that share only a filesystem: each version written with tensorstore as chunked, compressed
    XOR deltas against the previous one (unchanged chunks not written); replicas fetch before the pause."""

    type: Literal["tensorstore_delta"] = "tensorstore_delta"
    root: str = ""
    """Folder that every trainer and inference node mounts (versions live under it, per plan and rank)."""
    chunk_kb: int = 1024
    """Chunk size in KiB: the unit that is skipped when unchanged, and read by receivers."""
    full_every: int = 16
    """A sender writes a full version (no delta) at least this often; a replica without the previous version
    rebuilds from the last full one, and older versions are deleted."""

    def __post_init__(self):
        if not self.root:
            raise ValueError("weight_transfer.transport.root: set a folder every trainer and inference node mounts")
        if self.chunk_kb <= 0 or self.chunk_kb % 8:
            raise ValueError(f"weight_transfer.transport.chunk_kb={self.chunk_kb}: must be a positive multiple of 8")
        if self.full_every < 1:
            raise ValueError(f"weight_transfer.transport.full_every={self.full_every}: must be >= 1")


@dataclass
class NixlConfig:
    """RDMA pull through NIXL (UCX): each sender rank registers its buckets once per plan; every inference
    worker reads the buckets it needs from the rank that owns them (GPU memory on GPU machines, DRAM on CPU)."""

    type: Literal["nixl"] = "nixl"
    master_addr: str = "auto"
    """Where the inference workers reach the sender ranks' rendezvous stores (metadata, descriptors): auto
    (each sender's own node address) or one address for every sender."""


TransportConfig = BroadcastConfig | SharedMemoryConfig | CudaIpcConfig | TensorstoreDeltaConfig | NixlConfig
_TRANSPORTS = {"broadcast": BroadcastConfig, "shared_memory": SharedMemoryConfig, "cuda_ipc": CudaIpcConfig,
               "tensorstore_delta": TensorstoreDeltaConfig, "nixl": NixlConfig}


@dataclass
class TransportSpec:
    """``weight_transfer.transport`` as a recipe or the command line writes it: the ``type`` and every
    transport's options (Hydra cannot hold a union of configs); resolved to the typed config of ``type``."""

    type: str = "broadcast"
    """broadcast, shared_memory, cuda_ipc, tensorstore_delta, nixl, or auto (picked from the placement:
    :func:`choose_transport`)."""
    master_addr: str = "auto"
    """broadcast, nixl: where inference workers reach the senders' stores: auto (each sender's node address) or one address."""
    backend: str = "auto"
    """broadcast: auto (nccl for CUDA buffers, else gloo), gloo or nccl."""
    dir: str = "/dev/shm"
    """shared_memory: RAM-backed folder for bucket files."""
    root: str = ""
    """tensorstore_delta: folder every trainer and inference node mounts."""
    chunk_kb: int = 1024
    """tensorstore_delta: chunk size in KiB (unchanged chunks are not written)."""
    full_every: int = 16
    """tensorstore_delta: a full version at least this often (older ones are deleted)."""


@dataclass(frozen=True)
class Route:
    """What the placement says about the path from trainer ranks to inference engines (``type: auto``)."""

    on_gpu: bool
    """Trainer buffers and engines are on GPUs."""
    colocated: bool = False
    """Engines share the trainer's GPUs (placement.layout=colocated)."""
    same_host: bool = False
    """Every engine is on a node that holds trainer ranks."""
    rdma: bool = False
    """The nodes have RDMA NICs (InfiniBand or RoCE) that NIXL's UCX backend can use."""
    network: bool = True
    """Trainer and engine nodes reach each other over the network (False: they share only a filesystem)."""


def choose_transport(route: Route) -> str:
    """The transport ``type: auto`` picks: CUDA IPC on shared GPUs; shared memory on one CPU host; NCCL
    broadcast between GPUs of one host (NVLink: 370 GB/s measured on the H200 pair) or across nodes without
    RDMA; NIXL pull across nodes with RDMA; tensorstore deltas when only a filesystem is shared."""
    if not route.network:
        return "tensorstore_delta"
    if route.colocated and route.on_gpu:
        return "cuda_ipc"
    if route.same_host:
        return "broadcast" if route.on_gpu else "shared_memory"
    return "nixl" if route.rdma else "broadcast"


def transport_config(raw: dict | TransportSpec | TransportConfig, route: Route | None = None) -> TransportConfig:
    """The typed transport config chosen by ``type`` (named in the error when unknown); ``type: auto`` is
    resolved by :func:`choose_transport` from ``route`` (the placement's facts)."""
    if not isinstance(raw, (dict, TransportSpec)):
        return raw
    options = asdict(raw) if isinstance(raw, TransportSpec) else dict(raw)
    if options.get("type") == "auto":
        if route is None:
            raise ValueError("weight_transfer.transport.type=auto: needs the placement (Route) to pick a transport")
        options["type"] = choose_transport(route)
        raw = TransportSpec(**options) if isinstance(raw, TransportSpec) else raw
    kind = options.get("type")
    if kind not in _TRANSPORTS:
        raise ValueError(f"weight_transfer.transport.type={kind!r}: use one of {sorted(_TRANSPORTS)}")
    cls = _TRANSPORTS[kind]
    own = {f.name for f in fields(cls)}
    if isinstance(raw, TransportSpec):  # the other transports' options do not apply
        options = {k: v for k, v in options.items() if k in own}
    unknown = sorted(set(options) - own)
    if unknown:
        raise ValueError(f"weight_transfer.transport.{unknown[0]}: not an option of type={kind}; options: {sorted(own)}")
    return cls(**options)


def _type_of(raw) -> str | None:
    return raw.get("type") if isinstance(raw, dict) else getattr(raw, "type", None)


@dataclass
class WeightTransferConfig:
    """How trainer weights reach the inference fleet after each update."""

    transport: TransportSpec = field(default_factory=TransportSpec)
    """Transport strategy, chosen by its ``type``: broadcast, shared_memory, cuda_ipc, tensorstore_delta or nixl."""
    bucket_size_mb: int = 512
    """Size of one flat bucket in MiB; a larger tensor travels alone in its own bucket."""
    pause_mode: str = "keep"
    """How generation pauses around the load: keep (freeze in-flight requests; they resume on KV recomputed
    with the new weights), abort, or wait (drain)."""
    verify: str = "bucket_checksum"
    """bucket_checksum (fast) or tensor_equality (SHA-256 of every tensor, for debugging)."""
    load: str = "auto"
    """How a replica loads what arrived: reload (vLLM's ``reload_weights``: restores the checkpoint layout,
    loads, re-runs vLLM's processing after loading; any model), direct (the model's ``load_weights`` writes
    the parameters in place; only where vLLM processes nothing after loading: unquantized, no MLA or fused
    MoE, on CUDA) or auto (direct where it is valid, else reload)."""
    max_retries: int = 2
    """Attempts after the first for a replica whose transfer failed before it is quarantined."""
    rejoin_wait_s: float = 0.0
    """Before a retry, how long to wait for a replica of the failed attempt that stopped answering (a
    supervisor restarting its server at the same address); 0 retries at once, and a replica still down then
    counts another failure. Managed servers are not restarted: leave it at 0 unless something restarts them."""
    timeout_s: float = 300.0
    """Time limit of one transport operation (rendezvous, one bucket) before it counts as failed."""

    def __post_init__(self):
        if _type_of(self.transport) != "auto":
            transport_config(self.transport)  # validates; kept as written so the config stays a Hydra schema
        if self.bucket_size_mb <= 0:
            raise ValueError(f"weight_transfer.bucket_size_mb={self.bucket_size_mb}: must be positive")
        if self.pause_mode not in PAUSE_MODES:
            raise ValueError(f"weight_transfer.pause_mode={self.pause_mode!r}: use one of {PAUSE_MODES}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"weight_transfer.verify={self.verify!r}: use one of {VERIFY_MODES}")
        if self.load not in LOAD_MODES:
            raise ValueError(f"weight_transfer.load={self.load!r}: use one of {LOAD_MODES}")
        if self.max_retries < 0:
            raise ValueError(f"weight_transfer.max_retries={self.max_retries}: must be >= 0")
        if self.timeout_s <= 0:
            raise ValueError(f"weight_transfer.timeout_s={self.timeout_s}: must be positive")
        if self.rejoin_wait_s < 0:
            raise ValueError(f"weight_transfer.rejoin_wait_s={self.rejoin_wait_s}: must be >= 0 (0: retry at once)")

    @property
    def auto(self) -> bool:
        """Whether ``transport.type`` is auto (resolve it with :meth:`for_route` before use)."""
        return _type_of(self.transport) == "auto"

    @property
    def resolved_transport(self) -> TransportConfig:
        """The typed config of the chosen transport (``auto`` must be resolved first: :meth:`for_route`)."""
        return transport_config(self.transport)

    def for_route(self, route: Route) -> WeightTransferConfig:
        """This config with ``transport.type: auto`` replaced by the transport ``route`` calls for."""
        if _type_of(self.transport) != "auto":
            return self
        options = asdict(self.transport) if isinstance(self.transport, TransportSpec) else dict(self.transport)
        kind = choose_transport(route)
        resolved = {**options, "type": kind}
        if isinstance(self.transport, TransportSpec):
            return replace(self, transport=TransportSpec(**resolved))
        own = {f.name for f in fields(_TRANSPORTS[kind])}  # a dict may carry options for any of the choices
        return replace(self, transport={k: v for k, v in resolved.items() if k in own})

    @property
    def bucket_bytes(self) -> int:
        return self.bucket_size_mb << 20
