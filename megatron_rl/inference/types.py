"""What the generator sends to the fleet and gets back: token ids in, token ids out."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

STOP_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, passed to vLLM as they are."""

    max_tokens: int = 256
    """Most tokens to sample."""
    temperature: float = 1.0
    """Softmax temperature (1.0 samples from the policy itself)."""
    top_p: float = 1.0
    """Nucleus mass kept."""
    top_k: int = -1
    """Top-k kept (-1: all)."""
    seed: int | None = None
    """Per-request seed, for reproducible samples."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end the response (the tokenizer's EOS always does unless ignore_eos)."""
    ignore_eos: bool = False
    """Keep sampling past EOS (benchmarks)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("generate.sampling.max_tokens: must be >= 1")
        if self.temperature < 0:
            raise ValueError("generate.sampling.temperature: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("generate.sampling.top_p: must lie in (0, 1]")

    def to_payload(self) -> dict:
        payload = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "ignore_eos": self.ignore_eos,
        }
        if self.seed is not None:
            payload["seed"] = self.seed
        if self.stop_token_ids:
            payload["stop_token_ids"] = list(self.stop_token_ids)
        return payload


@dataclass(frozen=True)
class GenerationRequest:
    """One turn of one trajectory: the full prompt as token ids."""

    prompt_token_ids: list[int]
    """Every token the model conditions on (earlier turns included), never re-tokenised text."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """How to sample."""
    session_id: str | None = None
    """Trajectory id: turns of one session stay on one replica for prefix-cache reuse."""
    cache_salt: str | None = None
    """Prefix-cache salt; None uses the fleet's current weight version so no block crosses versions."""
    return_routed_experts: bool = False
    """MoE: also return the experts each layer routed each token to (for R3 routing replay)."""

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("GenerationRequest.prompt_token_ids: empty prompt; give at least one token id")


@dataclass
class GenerationResult:
    """What one replica sampled for one request."""

    token_ids: list[int]
    """Sampled token ids, in order."""
    logprobs: list[float]
    """Sampler's log-probability of each sampled token."""
    stop_reason: str
    """stop (EOS or stop token), length (max_tokens or context) or abort (paused with mode abort)."""
    replica: str
    """URL of the replica that produced it."""
    weight_version: str | None
    """Weight version the fleet was on when the request was sent (the cache salt's version)."""
    _: KW_ONLY  # the optional fields are easy to misplace by position
    routed_experts: list | None = None
    """MoE, when asked: expert indices [position, layer, top_k slot] for the prompt and response
    tokens from ``routed_experts_start`` on, up to the last sampled token (never forwarded)."""
    routed_experts_start: int = 0
    """First sequence position with a routing record (prefix-cached prompt tokens have none)."""
    attempts: int = 1
    """Replicas tried, including the one that answered."""
    latency_s: float = 0.0
    """Wall time on the answering replica."""
