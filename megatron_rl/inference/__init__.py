"""The sampler fleet: managed or external vLLM servers, a session-sticky router, the control plane."""

from megatron_rl.inference.config import InferenceConfig, RouterConfig, ServerConfig
from megatron_rl.inference.control import ControlPlane, UnsupportedOnPlatform
from megatron_rl.inference.fleet import InferenceFleet
from megatron_rl.inference.router import NoReplicaError
from megatron_rl.inference.types import GenerationRequest, GenerationResult, SamplingParams

__all__ = [
    "ControlPlane",
    "GenerationRequest",
    "GenerationResult",
    "InferenceConfig",
    "InferenceFleet",
    "NoReplicaError",
    "RouterConfig",
    "SamplingParams",
    "ServerConfig",
    "UnsupportedOnPlatform",
]
