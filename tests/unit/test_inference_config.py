"""Config validation names the dotted key; wire format and metric parsing."""

import base64
import io

import numpy as np
import pytest

from megatron_rl.inference.config import InferenceConfig, RouterConfig, ServerConfig
from megatron_rl.inference.metrics import fleet_metrics, prefix_cache_counters
from megatron_rl.inference.protocol import completion_payload, generate_payload, parse_choice
from megatron_rl.inference.server_process import server_command
from megatron_rl.inference.types import GenerationRequest, SamplingParams


@pytest.mark.parametrize("kwargs, key", [
    ({"num_servers": 0}, "inference.num_servers"),
    ({"num_servers": 2, "external_server_urls": ["http://x"]}, "inference.num_servers"),
    ({"num_servers": 0, "external_proxy_url": "http://p"}, "inference.external_server_urls"),
    ({"router": {"policy": "nope"}}, "inference.router.policy"),
    ({"server": {"dtype": "int8"}}, "inference.server.dtype"),
    ({"server": {"kv_cache_gib": -1}}, "inference.server.kv_cache_gib"),
    ({"server": {"routed_experts": "vllm"}}, "inference.server.routed_experts"),
])
def test_bad_config_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        InferenceConfig(**kwargs)


def test_server_command_carries_the_run_settings():
    cmd = server_command(ServerConfig(model_path="/m", kv_cache_gib=0.5, worker_extension="a.B"), 1234, seed=7)
    joined = " ".join(cmd)
    assert "vllm.entrypoints.openai.api_server" in joined and "--port 1234" in joined and "--seed 7" in joined
    assert f"--kv-cache-memory-bytes {1 << 29}" in joined and "--worker-extension-cls a.B" in joined
    assert "--gpu-memory-utilization" not in joined and "--enable-return-routed-experts" not in joined
    native = server_command(ServerConfig(model_path="/m", routed_experts="native"), 1, seed=0)
    assert "--enable-return-routed-experts" in native
    gpu = " ".join(server_command(ServerConfig(model_path="/m", kv_cache_gib=0), 1, seed=0))
    assert "--gpu-memory-utilization 0.85" in gpu


def test_payload_is_token_ids_with_logprobs_and_salt():
    req = GenerationRequest([1, 2], SamplingParams(max_tokens=5, stop_token_ids=(9,), seed=3), session_id="s")
    payload = completion_payload(req, "m", "weights-4")
    assert payload["prompt"] == [1, 2] and payload["logprobs"] == 0 and payload["return_token_ids"]
    assert payload["cache_salt"] == "weights-4" and payload["stop_token_ids"] == [9] and payload["seed"] == 3
    assert "cache_salt" not in completion_payload(req, "m", None)


def test_generate_payload_is_the_same_request_for_the_token_in_token_out_route():
    req = GenerationRequest([1, 2], SamplingParams(max_tokens=5, stop_token_ids=(9,), seed=3), session_id="s")
    payload = generate_payload(req, "m", "weights-4")
    assert payload["token_ids"] == [1, 2] and payload["cache_salt"] == "weights-4" and payload["model"] == "m"
    sampling = payload["sampling_params"]
    assert sampling["logprobs"] == 0 and sampling["stop_token_ids"] == [9] and sampling["seed"] == 3
    assert sampling["max_tokens"] == 5 and sampling["detokenize"] is False
    answer = {"token_ids": [4, 5], "finish_reason": "stop",
              "logprobs": {"content": [{"token": "token_id:4", "logprob": -0.5}, {"token": "token_id:5", "logprob": -2.0}]}}
    assert parse_choice({"choices": [answer]}) == ([4, 5], [-0.5, -2.0], "stop", None)


def test_parse_choice_reads_ids_logprobs_reason_and_native_routed_experts():
    experts = np.arange(12, dtype=np.uint8).reshape(2, 3, 2)
    buf = io.BytesIO()
    np.save(buf, experts)
    choice = {"token_ids": [4, 5], "logprobs": {"token_logprobs": [-0.5, -1.5]}, "finish_reason": "abort",
              "routed_experts": base64.b64encode(buf.getvalue()).decode()}
    ids, lps, reason, routed = parse_choice({"choices": [choice]})
    assert (ids, lps, reason, routed) == ([4, 5], [-0.5, -1.5], "abort", experts.tolist())
    with pytest.raises(ValueError, match="log-probs"):
        parse_choice({"choices": [{**choice, "logprobs": {"token_logprobs": [-1.0]}}]})


def test_prefix_cache_counters_sum_engines_and_fleet_metrics_flatten():
    text = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0\n'
            'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 100.0\n'
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 50.0\n'
            'vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9\n')
    assert prefix_cache_counters(text) == (80.0, 200.0)
    assert prefix_cache_counters("nothing here") is None
    out = fleet_metrics({"a": {"in_flight": 2, "prefix_cache_hits": 80.0, "prefix_cache_queries": 200.0},
                         "b": {"in_flight": 1, "prefix_cache_hits": 0.0, "prefix_cache_queries": 200.0}})
    assert out["inference/in_flight"] == 3 and out["inference/replica1/in_flight"] == 1
    assert out["inference/prefix_cache_hit_rate"] == pytest.approx(0.2)
    assert all(k == k.lower() and k.startswith("inference/") for k in out)


def test_router_config_bounds():
    with pytest.raises(ValueError, match="inference.router.max_attempts"):
        RouterConfig(max_attempts=0)
