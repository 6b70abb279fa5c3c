"""Token ids in, token ids and log-probs out, matching transformers; weight-version cache salt."""

import asyncio
import dataclasses

import numpy as np
import torch
import transformers

from megatron_rl.inference import GenerationRequest, SamplingParams
from megatron_rl.inference.protocol import GENERATE_PATH, completion_payload, generate_payload, parse_choice

from helpers import run_with_fleet


def hf_logprobs(model_dir, prompt: list[int], ids: list[int]) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def test_fleet_logprobs_match_transformers(fleet_config, moe_model):
    tok = transformers.AutoTokenizer.from_pretrained(moe_model)
    prompts = [tok.encode(text) for text in ("What is 12 + 30?", "Schedule the battery for tonight.")]
    sampling = SamplingParams(max_tokens=32, temperature=1.0, seed=3, ignore_eos=True)

    async def body(fleet):
        return [await fleet.generate(GenerationRequest(p, sampling, session_id=f"s{i}")) for i, p in enumerate(prompts)]

    results = run_with_fleet(fleet_config, body)
    for prompt, result in zip(prompts, results):
        assert len(result.token_ids) == 32 and result.stop_reason == "length"
        assert all(0 <= t < len(tok) for t in result.token_ids)
        expected = hf_logprobs(moe_model, prompt, result.token_ids)
        diff = (torch.tensor(result.logprobs) - expected).abs().max().item()
        assert diff < 1e-3, f"fleet and transformers log-probs differ by {diff}"


def test_stop_token_ends_the_response_with_stop_reason_stop(fleet_config):
    async def body(fleet):
        # Greedy decoding of the same prompt twice; the second run stops at its own 3rd token.
        first = await fleet.generate(GenerationRequest([5, 6, 7], SamplingParams(max_tokens=8, temperature=0.0)))
        stop = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(first.token_ids[2],))
        second = await fleet.generate(GenerationRequest([5, 6, 7], stop))
        return first, second

    first, second = run_with_fleet(fleet_config, body)
    assert second.stop_reason == "stop"
    assert second.token_ids == first.token_ids[: len(second.token_ids)] and len(second.token_ids) <= 3


def test_weight_version_salts_the_prefix_cache(fleet_config):
    """The same long prompt hits the prefix cache, until the weight version changes."""
    prompt = [(7 * i) % 1900 + 10 for i in range(300)]  # > 2 blocks of 128 tokens
    request = GenerationRequest(prompt, SamplingParams(max_tokens=2), session_id="salted")

    async def hits(fleet, replica_url):
        replica = next(r for r in fleet.router.replicas if r.url == replica_url)
        return (await replica.metrics())["prefix_cache_hits"]

    async def body(fleet):
        await fleet.set_weight_version("salt-a")
        first = await fleet.generate(request)
        h0 = await hits(fleet, first.replica)
        again = await fleet.generate(request)
        h1 = await hits(fleet, first.replica)
        await fleet.set_weight_version("salt-b")
        other = await fleet.generate(request)
        h2 = await hits(fleet, first.replica)
        explicit = await fleet.generate(dataclasses.replace(request, cache_salt="weights-salt-a"))
        h3 = await hits(fleet, first.replica)
        return first, again, other, explicit, (h0, h1, h2, h3)

    first, again, other, explicit, (h0, h1, h2, h3) = run_with_fleet(fleet_config, body)
    assert first.replica == again.replica == other.replica == explicit.replica
    assert (first.weight_version, other.weight_version) == ("salt-a", "salt-b")
    assert h1 - h0 >= 256, "a repeated prompt under one version must hit the prefix cache"
    assert h2 == h1, "a new weight version must not reuse blocks cached under the old one"
    assert h3 - h2 >= 256, "an explicit salt of the old version reaches the old blocks again"


def test_metrics_report_per_replica_load_latency_throughput_and_cache_hits(fleet_config):
    async def body(fleet):
        reqs = [GenerationRequest([60 + i, 61, 62], SamplingParams(max_tokens=16, ignore_eos=True)) for i in range(8)]
        results = await asyncio.gather(*(fleet.generate(r) for r in reqs))
        return results, await fleet.metrics()

    results, metrics = run_with_fleet(fleet_config, body)
    by_replica = {r.replica for r in results}
    assert metrics["inference/requests"] == 8 and metrics["inference/completion_tokens"] == 8 * 16
    assert metrics["inference/in_flight"] == 0 and metrics["inference/tokens_per_s"] > 0
    for i in range(len(fleet_config.external_server_urls)):
        assert f"inference/replica{i}/latency_p50_s" in metrics
        assert 0 <= metrics[f"inference/replica{i}/prefix_cache_hit_rate"] <= 1
    assert len(by_replica) == 2 and 0 <= metrics["inference/prefix_cache_hit_rate"] <= 1


def test_routed_experts_captured_by_the_worker_extension_match_transformers(fleet_config, moe_model):
    prompt = [(13 * i) % 1900 + 11 for i in range(20)]
    request = GenerationRequest(prompt, SamplingParams(max_tokens=12, ignore_eos=True, seed=2),
                                cache_salt="r3-test", return_routed_experts=True)

    async def body(fleet):
        return await fleet.generate(request), await fleet.generate(dataclasses.replace(request, cache_salt="r3-b"))

    result, again = run_with_fleet(fleet_config, body)
    assert result.routed_experts_start == 0
    routed = torch.tensor(result.routed_experts)
    seq = prompt + result.token_ids
    assert routed.shape == (len(seq) - 1, 2, 2), "[positions up to the last sampled token, layers, top_k]"
    model = transformers.AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([seq[:-1]]), output_router_logits=True).router_logits
    expected = torch.stack([layer.reshape(len(seq) - 1, -1).topk(2, dim=-1).indices for layer in logits], dim=1)
    assert torch.equal(routed.sort(-1).values, expected.sort(-1).values)
    assert again.routed_experts is not None and len(again.routed_experts) == len(prompt) + 11


def test_the_token_in_token_out_route_answers_as_completions_do(fleet_config):
    """R3 requests go to vLLM's ``/inference/v1/generate`` where vLLM returns the routed experts itself (GPU).
    Here (CPU build, no native capture) the same seeded request there and at ``/v1/completions`` gives the same
    tokens, log-probs and stop reason, read by the one parser."""
    prompt = [(17 * i) % 1900 + 13 for i in range(24)]
    seeded = GenerationRequest(prompt, SamplingParams(max_tokens=16, seed=7), cache_salt="tito")

    async def both(fleet, request):
        replica = fleet.router.replicas[0]
        completion, _ = await replica.complete(completion_payload(request, fleet.model, "tito"), {}, 120)
        generate, _ = await replica.complete(generate_payload(request, fleet.model, "tito"), {}, 120, GENERATE_PATH)
        return parse_choice(completion), parse_choice(generate)

    async def body(fleet):
        first = await both(fleet, seeded)
        stop_at = first[0][0][3]
        stopped = dataclasses.replace(seeded, sampling=dataclasses.replace(seeded.sampling, stop_token_ids=(stop_at,)))
        return first, await both(fleet, stopped)

    (completion, generate), (stopped_c, stopped_g) = run_with_fleet(fleet_config, body)
    ids, logprobs, reason, routed = generate
    assert ids == completion[0] and len(ids) == 16 and reason == completion[2] == "length" and routed is None
    np.testing.assert_allclose(logprobs, completion[1], atol=1e-5)
    assert stopped_g[0] == stopped_c[0] and stopped_g[2] == stopped_c[2] == "stop" and len(stopped_g[0]) <= 4
