"""``inference.*``: the sampler fleet: managed or external vLLM servers behind one router."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("sticky_least_loaded", "least_loaded", "round_robin")
DTYPES = ("float32", "bfloat16", "float16")
ROUTE_CAPTURES = ("auto", "native", "hooks")


@dataclass
class ServerConfig:
    """``inference.server.*``: how each managed vLLM server is started."""

    model_path: str = ""
    """HF checkpoint directory the servers load (the run fills it from ``model.path``)."""
    dtype: str = ""
    """Weight and activation dtype of the servers: empty follows ``model.dtype`` (float32 for a server started
    outside a run); float32, bfloat16 or float16 samples in another precision than the trainer trains in (a
    sampler/trainer mismatch study: ``benchmarks/repro/router_mismatch.py``)."""
    max_model_len: int = 2048
    """Longest prompt plus response, in tokens."""
    kv_cache_gib: float = 1.0
    """KV cache per server in GiB; 0 sizes it from ``gpu_memory_utilization`` (GPU only: the CPU
    build cannot size it itself)."""
    gpu_memory_utilization: float = 0.85
    """Fraction of GPU memory a server may take when ``kv_cache_gib`` is 0."""
    tensor_parallel_size: int = 1
    """Tensor-parallel ranks per server."""
    seed: int = 0
    """Sampling seed of each server (server i uses seed + i)."""
    enforce_eager: bool = True
    """Skip graph capture/compilation (starts faster; required on the CPU build)."""
    worker_extension: str = "megatron_rl.inference.worker_extension.MegatronRLWorkerExtension"
    """Qualified name of the vLLM worker extension class injected into every worker (empty: none)."""
    routed_experts: str = "auto"
    """How an R3 run gets the experts each token was routed to: ``native`` (vLLM's own capture: the server starts
    with ``--enable-return-routed-experts`` and R3 requests go to its token-in/token-out ``/inference/v1/generate``;
    vLLM's GPU model runner), ``hooks`` (the worker extension's hooks on the MoE gates; the CPU build, or routers
    with plain top-k), ``auto`` (``native`` when the run uses R3 on a CUDA machine, else ``hooks``)."""
    extra_args: list[str] = field(default_factory=list)
    """More ``vllm.entrypoints.openai.api_server`` flags, passed through verbatim."""
    startup_timeout_s: float = 300.0
    """Seconds to wait for a server's ``/health`` before giving up with its log tail."""
    run_dir: str = ""
    """Folder for server logs, vLLM caches, temp files and IPC sockets; empty: the run folder's
    ``inference/`` (a temporary folder outside a run)."""

    def __post_init__(self) -> None:
        if self.dtype and self.dtype not in DTYPES:
            raise ValueError(f"inference.server.dtype: {self.dtype!r} is not one of {DTYPES} (or empty: model.dtype)")
        if self.max_model_len < 16:
            raise ValueError(f"inference.server.max_model_len: {self.max_model_len} is too small; use >= 16")
        if self.kv_cache_gib < 0:
            raise ValueError(f"inference.server.kv_cache_gib: {self.kv_cache_gib} must be >= 0 (e.g. 1.0)")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("inference.server.gpu_memory_utilization: must lie in (0, 1], e.g. 0.85")
        if self.tensor_parallel_size < 1:
            raise ValueError("inference.server.tensor_parallel_size: must be >= 1")
        if self.routed_experts not in ROUTE_CAPTURES:
            raise ValueError(f"inference.server.routed_experts: {self.routed_experts!r} is not one of {ROUTE_CAPTURES}")
        if self.startup_timeout_s <= 0:
            raise ValueError("inference.server.startup_timeout_s: must be > 0 (e.g. 300)")


@dataclass
class RouterConfig:
    """``inference.router.*``: how requests are spread over replicas and retried."""

    policy: str = "sticky_least_loaded"
    """Replica choice: sticky_least_loaded (sessions stay put), least_loaded or round_robin."""
    max_attempts: int = 3
    """Tries per request, each on a different healthy replica, before the request fails."""
    request_timeout_s: float = 600.0
    """Seconds one generation request may take on one replica."""
    health_interval_s: float = 2.0
    """Seconds between health probes of every replica."""
    health_failures: int = 3
    """Consecutive failed probes before a replica leaves rotation: one slow ``/health`` on a busy machine is
    not an outage (a failed request still takes its replica out at once)."""
    rotation_wait_s: float = 120.0
    """Seconds a request waits for a replica to come back when none is in rotation (every one failed its
    probes, e.g. a CPU replica busy loading new weights) before it fails; 0 fails at once."""
    max_concurrency: int = 256
    """Generation requests in flight at once across the fleet (client side)."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"inference.router.policy: {self.policy!r} is not one of {POLICIES}")
        if self.max_attempts < 1:
            raise ValueError("inference.router.max_attempts: must be >= 1")
        if self.request_timeout_s <= 0 or self.health_interval_s <= 0:
            raise ValueError("inference.router.request_timeout_s and health_interval_s: must be > 0")
        if self.max_concurrency < 1:
            raise ValueError("inference.router.max_concurrency: must be >= 1")
        if self.rotation_wait_s < 0:
            raise ValueError("inference.router.rotation_wait_s: must be >= 0 (0: fail at once)")
        if self.health_failures < 1:
            raise ValueError(f"inference.router.health_failures: must be >= 1, got {self.health_failures}")


@dataclass
class InferenceConfig:
    """``inference.*``: managed servers (``num_servers``) or an external fleet (``external_*``)."""

    num_servers: int = 1
    """Managed vLLM servers to start (0 when the fleet is external)."""
    external_proxy_url: str = ""
    """Data-plane URL of an external router/proxy; requests go there instead of to the servers."""
    external_server_urls: list[str] = field(default_factory=list)
    """Control-plane URLs of external vLLM servers (also the data plane when no proxy is given)."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """How managed servers are started."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """Routing and retry policy."""

    def __post_init__(self) -> None:
        if isinstance(self.server, dict):
            self.server = ServerConfig(**self.server)
        if isinstance(self.router, dict):
            self.router = RouterConfig(**self.router)
        external = bool(self.external_server_urls or self.external_proxy_url)
        if external and self.num_servers:
            raise ValueError("inference.num_servers: must be 0 when inference.external_server_urls is set")
        if self.external_proxy_url and not self.external_server_urls:
            raise ValueError("inference.external_server_urls: list the servers behind inference.external_proxy_url")
        if not external and self.num_servers < 1:
            raise ValueError("inference.num_servers: must be >= 1, or set inference.external_server_urls")

    @property
    def external(self) -> bool:
        """Whether the servers were started elsewhere (URLs given) rather than by us."""
        return bool(self.external_server_urls)
