"""The fleet the generator talks to: managed or external vLLM servers, one router, the control plane.

    async with InferenceFleet(config) as fleet:
        result = await fleet.generate(GenerationRequest(prompt_ids, SamplingParams(), session_id="t0"))
        await fleet.control.pause("keep"); ...; await fleet.set_weight_version("1"); await fleet.control.resume()
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp


from megatron_rl.env_vars import run_secret
from megatron_rl.inference.auth import auth_header, new_secret
from megatron_rl.inference.config import InferenceConfig
from megatron_rl.inference.control import ControlPlane
from megatron_rl.inference.launcher import LocalServers, RayServers
from megatron_rl.inference.metrics import fleet_metrics
from megatron_rl.inference.protocol import COMPLETIONS_PATH, GENERATE_PATH, completion_payload, generate_payload, parse_choice
from megatron_rl.inference.replica import KEEPALIVE_S, Replica, ReplicaError
from megatron_rl.inference.router import NoReplicaError, Router
from megatron_rl.inference.types import GenerationRequest, GenerationResult
from megatron_rl.runtime.config import PlacementConfig


class NodeLostError(RuntimeError):
    """A node that ran servers of this fleet is gone (Ray counts it dead, or it does not answer)."""


class InferenceFleet:
    """Async client of the sampler fleet. Managed servers are started on ``start`` (from the calling
    thread, or by Ray actors on their nodes when ``placement.servers=ray``) and stopped on ``close``;
    external ones are only connected to. Managed servers refuse requests without the run's secret
    (``MEGATRON_RL_RUN_SECRET``, or one made for this fleet); every call here carries it."""

    def __init__(self, config: InferenceConfig, placement: PlacementConfig | None = None,
                 server_options: list[dict] | None = None):
        self.config = config
        self.placement = placement or PlacementConfig()
        self.server_options = server_options
        """Ray options per managed server's actor (its placement-group bundle), with ``placement.servers=ray``."""
        self.secret = run_secret() or (None if config.external else new_secret())
        """The run secret the servers check (None: an external fleet without one)."""
        self.local: LocalServers | RayServers | None = None
        self.router: Router | None = None
        self.control: ControlPlane | None = None
        self.model = ""
        self.weight_version: str | None = None
        self.server_urls: list[str] = []
        """Control-plane URLs of every server (the weight-transfer receivers)."""
        self._http: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(config.router.max_concurrency)
        self._lost: list[str] = []

    async def start(self) -> "InferenceFleet":
        cfg = self.config
        if cfg.external:
            server_urls = list(cfg.external_server_urls)
        else:
            if self.placement.servers == "ray":
                self.local = RayServers(cfg.server, cfg.num_servers, self.placement.server_resources, self.secret,
                                        self.server_options)
            else:
                self.local = LocalServers(cfg.server, cfg.num_servers, secret=self.secret)
            self.local.start()
            server_urls = self.local.urls
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
        self._http = aiohttp.ClientSession(connector=connector, headers=auth_header(self.secret))
        servers = [Replica(url, self._http) for url in server_urls]
        data = [Replica(cfg.external_proxy_url, self._http)] if cfg.external_proxy_url else servers
        self.server_urls = server_urls
        self.router = Router(data, cfg.router)
        self.control = ControlPlane(servers, cfg.router.request_timeout_s)
        self.model = (await data[0].get("/v1/models"))["data"][0]["id"]
        versions = set((await self.control.weight_versions()).values())
        self.weight_version = versions.pop() if len(versions) == 1 else None
        self.router.start()
        return self

    async def close(self) -> None:
        if self.router is not None:
            await self.router.stop()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.local is not None:
            self.local.stop()
            self.local = None

    async def __aenter__(self) -> "InferenceFleet":
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sample one response; retried on another replica if the first one fails. A failure that Ray explains by
        a lost node (no replica left, or the routing-capture calls to the replica that served it) names the node."""
        async with self._naming_lost_nodes():
            return await self._generate(request)

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        version = self.weight_version
        salt = request.cache_salt or (f"weights-{version}" if version is not None else None)
        native = request.return_routed_experts and self.config.server.routed_experts == "native"
        hooks = request.return_routed_experts and not native
        if native:
            payload, path = generate_payload(request, self.model, salt), GENERATE_PATH
        else:
            payload, path = completion_payload(request, self.model, salt), COMPLETIONS_PATH
        if hooks:
            await self._capture_routes()
        async with self._slots:
            body, replica, attempts, latency = await self.router.send(payload, request.session_id, path)
        token_ids, logprobs, reason, experts = parse_choice(body)
        result = GenerationResult(token_ids, logprobs, reason, replica.url, version, routed_experts=experts,
                                  attempts=attempts, latency_s=latency)
        if hooks and experts is None:
            await self._attach_captured_routes(replica, body["id"], result)
        return result

    @contextlib.asynccontextmanager
    async def _naming_lost_nodes(self):
        """A replica call's failure that Ray explains by a lost node is raised as that node's loss."""
        try:
            yield
        except (NoReplicaError, ReplicaError) as err:
            lost = self.node_loss(err)
            if lost is None:
                raise
            raise lost from err

    def lost_nodes(self, silent_is_lost: bool = True) -> list[str]:
        """Addresses of the nodes whose servers Ray counts dead, whose server actors died or (``silent_is_lost``)
        do not answer. A lost node stays lost: once one is found, Ray is not asked again."""
        if not self._lost and self.local is not None:
            self._lost = self.local.lost_nodes(silent_is_lost=silent_is_lost)
        return self._lost

    def node_loss(self, err: Exception) -> NodeLostError | None:
        """``err`` restated as the loss of the nodes behind it, when Ray counts them dead or they do not answer."""
        lost = self.lost_nodes()
        if not lost:
            return None
        return NodeLostError(f"inference node(s) {', '.join(lost)} lost (Ray counts it dead or its server's actor "
                             f"does not answer); their vLLM servers went with them: {type(err).__name__}: {err}")

    async def _capture_routes(self) -> None:
        """Hook the MoE gates of replicas not yet capturing (the worker extension's R3 fallback)."""
        todo = [r for r in self.router.replicas if r.healthy and not r.capturing_routes]
        body = {"method": "mrl_start_routing_capture"}
        await asyncio.gather(*(r.post("/collective_rpc", body) for r in todo))
        for replica in todo:
            replica.capturing_routes = True

    async def _attach_captured_routes(self, replica: Replica, request_id: str, result: GenerationResult) -> None:
        body = {"method": "mrl_pop_routed_experts", "args": [request_id]}
        record = (await replica.post("/collective_rpc", body))["results"][0]
        if record is not None:
            result.routed_experts, result.routed_experts_start = record["experts"], record["start"]

    def end_session(self, session_id: str) -> None:
        """Forget a finished trajectory's replica (sticky routing keeps one entry per live session)."""
        forget = getattr(self.router.policy, "forget", None)
        if forget is not None:
            forget(session_id)

    async def set_weight_version(self, version: str) -> None:
        """Tag every replica with ``version`` and salt later requests' prefix cache with it."""
        async with self._naming_lost_nodes():
            await self.control.set_weight_version(version)
        self.weight_version = version

    async def metrics(self) -> dict[str, float]:
        """``inference/*`` metrics: per replica in-flight, latency, tokens/s, prefix-cache hit rate."""
        replicas = self.router.replicas
        per_replica = await asyncio.gather(*(r.metrics() for r in replicas))
        return fleet_metrics({r.url: m for r, m in zip(replicas, per_replica)})
