"""The wire format: token-id requests to vLLM's ``/v1/completions`` (or, where vLLM itself returns the routed
experts of R3 requests, its token-in/token-out ``/inference/v1/generate``) and the fields we read back."""

from __future__ import annotations

import base64
import io

import numpy as np

from megatron_rl.inference.types import STOP_REASONS, GenerationRequest

SESSION_HEADER = "X-Session-Id"
COMPLETIONS_PATH = "/v1/completions"
GENERATE_PATH = "/inference/v1/generate"


def completion_payload(request: GenerationRequest, model: str, cache_salt: str | None) -> dict:
    """A ``/v1/completions`` body: token-id prompt, sampled-token log-probs, token ids back."""
    payload = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "logprobs": 0,
        "return_token_ids": True,
        "n": 1,
        **request.sampling.to_payload(),
    }
    if cache_salt:
        payload["cache_salt"] = cache_salt
    return payload


def generate_payload(request: GenerationRequest, model: str, cache_salt: str | None) -> dict:
    """A ``/inference/v1/generate`` body: the same request as ``completion_payload``, nothing detokenised."""
    payload = {
        "model": model,
        "token_ids": list(request.prompt_token_ids),
        "sampling_params": {**request.sampling.to_payload(), "logprobs": 0, "detokenize": False},
    }
    if cache_salt:
        payload["cache_salt"] = cache_salt
    return payload


def parse_choice(body: dict) -> tuple[list[int], list[float], str, list | None]:
    """(token ids, log-probs, stop reason, routed experts or None) of a one-choice answer from either route."""
    choice = body["choices"][0]
    token_ids = list(choice["token_ids"])
    logprobs = _sampled_logprobs(choice.get("logprobs"))
    if len(logprobs) != len(token_ids):
        raise ValueError(f"server returned {len(token_ids)} tokens but {len(logprobs)} log-probs")
    reason = choice.get("finish_reason") or "abort"
    if reason not in STOP_REASONS:
        raise ValueError(f"server returned unknown finish_reason {reason!r}")
    return token_ids, logprobs, reason, decode_routed_experts(choice.get("routed_experts"))


def _sampled_logprobs(logprobs: dict | None) -> list[float]:
    """The sampled tokens' log-probs: ``token_logprobs`` (completions) or ``content[i].logprob`` (generate)."""
    if not logprobs:
        return []
    if "content" in logprobs:
        return [entry["logprob"] for entry in logprobs["content"]]
    return list(logprobs["token_logprobs"])


def decode_routed_experts(encoded: str | None) -> list | None:
    """vLLM's native R3 field: base64 ``.npy`` of shape [tokens, layers, top_k] (None when off)."""
    if not encoded:
        return None
    return np.load(io.BytesIO(base64.b64decode(encoded))).tolist()
