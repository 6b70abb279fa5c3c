"""Megatron log-probs equal transformers' on the same weights; TP/PP/EP=2 equal 1; HF round trip exact.

float32 on CPU, megatron-core over gloo. One spawned process builds all four families at TP=PP=EP=1;
each parallel layout runs on two processes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from parallel_launch import run_ranks
from parallel_ranks import logprobs_rank, trainer_config
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ARCHS = ("qwen2", "qwen3", "qwen3_moe", "llama")
TOL = 1e-5


def hf_reference(hf_dir, batch, temperature: float = 1.0):
    """transformers' (log-probs, entropy) of the batch's own tokens under softmax(logits / temperature), zero on
    padding and position 0."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(batch.input_ids, attention_mask=batch.attention_mask.long()).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits / temperature, -1)
    logp = logp_all.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    pad = lambda x: torch.nn.functional.pad(x, (1, 0)) * batch.attention_mask  # noqa: E731
    return pad(logp), pad(ent)


def assert_round_trip(exported: dict, hf_dir):
    original = load_file(f"{hf_dir}/model.safetensors")
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert exported[name].dtype == tensor.dtype, name
        assert torch.equal(exported[name], tensor), name


@pytest.fixture(scope="module")
def single(tiny, batch, tmp_path_factory):
    """arch -> (log-probs, entropy, exported) at TP=PP=EP=1, one process."""
    cases = [(tiny[a], trainer_config(max_tokens_per_micro_batch=24)) for a in ARCHS]
    (results,) = run_ranks(logprobs_rank, 1, tmp_path_factory.mktemp("single"), cases, batch)
    return dict(zip(ARCHS, results))


@pytest.mark.parametrize("arch", ARCHS)
def test_logprobs_and_entropy_match_transformers(arch, single, tiny, batch):
    logp, ent, _ = single[arch]
    ref_logp, ref_ent = hf_reference(tiny[arch], batch)
    assert (logp - ref_logp).abs().max() < TOL
    assert (ent - ref_ent).abs().max() < TOL
    assert (ref_logp != 0).sum() == batch.attention_mask.sum() - batch.num_rows  # the test sees every token


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_megatron_hf_round_trip_is_bit_exact(arch, single, tiny):
    assert_round_trip(single[arch][2], tiny[arch])


def test_local_attention_spec_matches_sdpa(single, tiny, batch, tmp_path):
    cfg = trainer_config(attention_backend="local")
    ((logp, _, _),) = run_ranks(logprobs_rank, 1, tmp_path, [(tiny["qwen3"], cfg)], batch)[0]
    assert (logp - single["qwen3"][0]).abs().max() < TOL


def test_rows_sampled_at_a_temperature_are_scored_under_it_over_two_vocab_slices(tiny, batch, tmp_path):
    """TrainingBatch.temperature 0.7: log-probs and entropy of softmax(logits / 0.7), the vocabulary split by TP=2."""
    cfg = trainer_config(tp=2, max_tokens_per_micro_batch=24)
    ranks = run_ranks(logprobs_rank, 2, tmp_path, [(tiny["qwen2"], cfg)], dataclasses.replace(batch, temperature=0.7))
    ref_logp, ref_ent = hf_reference(tiny["qwen2"], batch, temperature=0.7)
    untempered, _ = hf_reference(tiny["qwen2"], batch)
    assert (ref_logp - untempered).abs().max() > 100 * TOL, "the temperature must change what is compared"
    for ((logp, ent, _),) in ranks:
        assert (logp - ref_logp).abs().max() < TOL
        assert (ent - ref_ent).abs().max() < TOL


@pytest.mark.parametrize(
    "arch,layout",
    [("qwen2", dict(tp=2)), ("qwen3", dict(pp=2)), ("qwen3_moe", dict(ep=2)), ("qwen3_moe", dict(tp=2))],
    ids=["qwen2-tp2", "qwen3-pp2", "qwen3_moe-ep2", "qwen3_moe-tp2"],
)
def test_two_rank_layouts_equal_one_rank(arch, layout, single, tiny, batch, tmp_path):
    cfg = trainer_config(**layout, max_tokens_per_micro_batch=24)
    ranks = run_ranks(logprobs_rank, 2, tmp_path, [(tiny[arch], cfg)], batch)
    logp1, ent1, _ = single[arch]
    exported = {}
    for ((logp, ent, owned),) in ranks:
        assert (logp - logp1).abs().max() < TOL
        assert (ent - ent1).abs().max() < TOL
        assert not set(owned) & set(exported), "a tensor was exported by two ranks"
        exported.update(owned)
    assert_round_trip(exported, tiny[arch])
