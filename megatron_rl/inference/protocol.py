"""The wire format: token-id requests to vLLM's ``/v1/completions`` and the fields we read back."""

from __future__ import annotations

import base64
import io

import numpy as np

from megatron_rl.inference.types import STOP_REASONS, GenerationRequest

SESSION_HEADER = "X-Session-Id"


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


def parse_choice(body: dict) -> tuple[list[int], list[float], str, list | None]:
    """(token ids, log-probs, stop reason, routed experts or None) of a one-choice completion."""
    choice = body["choices"][0]
    token_ids = list(choice["token_ids"])
    logprobs = list(choice["logprobs"]["token_logprobs"]) if choice.get("logprobs") else []
    if len(logprobs) != len(token_ids):
        raise ValueError(f"server returned {len(token_ids)} tokens but {len(logprobs)} log-probs")
    reason = choice.get("finish_reason") or "abort"
    if reason not in STOP_REASONS:
        raise ValueError(f"server returned unknown finish_reason {reason!r}")
    return token_ids, logprobs, reason, decode_routed_experts(choice.get("routed_experts"))


def decode_routed_experts(encoded: str | None) -> list | None:
    """vLLM's native R3 field: base64 ``.npy`` of shape [tokens, layers, top_k] (None when off)."""
    if not encoded:
        return None
    return np.load(io.BytesIO(base64.b64decode(encoded))).tolist()
