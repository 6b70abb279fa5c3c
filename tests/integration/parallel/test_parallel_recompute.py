"""Activation recompute changes memory, not results: one training step with full or selective
recompute leaves the same weights as without, dense and MoE, also under pipeline parallelism with
routing replay (each recompute must replay its own micro-batch's experts while 1F1B interleaves)."""

from __future__ import annotations

import re

import pytest
import torch
from parallel_launch import run_ranks
from parallel_ranks import batch_of, config_error_rank, recompute_rank, trainer_config
from safetensors.torch import load_file

from correction.routing_replay import RoutedExperts, RoutingReplayConfig
from megatron_rl.algorithms.config import AlgorithmConfig
from parallel.config import OptimizerConfig, RecomputeConfig

FULL = RecomputeConfig(granularity="full", method="uniform", num_layers=1)


def graded_batch(routed: bool):
    """Five rows (several micro-batches at the test's budget) with +-1 advantages; with ``routed``,
    random experts per token that the trainer's own router would not choose."""
    g = torch.Generator().manual_seed(2)
    batch = batch_of([torch.randint(3, 2000, (n,), generator=g).tolist() for n in (10, 8, 9, 6, 7)], prompt_len=3)
    batch.advantages = batch.loss_mask * torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])[:, None]
    if routed:
        lengths = batch.attention_mask.sum(1).long().tolist()
        batch.routed_experts = [
            RoutedExperts(torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(n * 2)]).reshape(n, 2, 2), 4)
            for n in lengths
        ]
    return batch


def step_all(hf_dir, recomputes, layout, algo, batch, tmp_path, world=1):
    cfgs = [
        trainer_config(**layout, max_tokens_per_micro_batch=20, recompute=r, optimizer=OptimizerConfig(lr=1e-2))
        for r in recomputes
    ]
    return run_ranks(recompute_rank, world, tmp_path, hf_dir, cfgs, algo, batch)


def assert_same_step(ranks, hf_dir):
    """Every config's weights after the step equal the first's (which moved away from the start)."""
    start = load_file(f"{hf_dir}/model.safetensors")
    moved = 0.0
    for per_cfg in ranks:
        (_, _, ref), *others = per_cfg
        moved = max([moved] + [float((ref[n] - start[n]).abs().max()) for n in ref])
        for _, _, weights in others:
            assert sorted(weights) == sorted(ref)
            for name, tensor in weights.items():
                assert torch.allclose(tensor, ref[name], rtol=0, atol=1e-6), name
    assert moved > 1e-3, "the step must change the weights for the comparison to mean anything"


def test_dense_full_and_selective_recompute_match_no_recompute(tiny, tmp_path):
    selective = RecomputeConfig(granularity="selective", modules=["core_attn", "mlp"])
    ranks = step_all(tiny["qwen3"], [RecomputeConfig(), FULL, selective], {}, AlgorithmConfig(), graded_batch(False), tmp_path)
    assert_same_step(ranks, tiny["qwen3"])


@pytest.mark.parametrize("recompute", [FULL, RecomputeConfig(granularity="selective", modules=["moe"])], ids=["full", "moe"])
def test_moe_recompute_under_pp2_replays_each_micro_batch_own_experts(recompute, tiny, tmp_path):
    algo = AlgorithmConfig(routing_replay=RoutingReplayConfig(mode="r3"))
    batch = graded_batch(True)
    ranks = step_all(tiny["qwen3_moe"], [RecomputeConfig(), recompute], dict(pp=2), algo, batch, tmp_path, world=2)
    assert_same_step(ranks, tiny["qwen3_moe"])
    for (plain_metrics, plain_calls, _), (_, recomputed_calls, _) in ranks:
        assert plain_calls > 0 and recomputed_calls == 2 * plain_calls, "every router runs again in backward"
    assert ranks[1][0][0]["perf/micro_batches"] >= 3


def test_a_recompute_the_layout_cannot_take_names_the_key(tiny, tmp_path):
    cases = {
        "trainer.recompute.num_layers: 2 but each pipeline stage holds 1": RecomputeConfig(granularity="full", num_layers=2),
        "trainer.recompute.modules: layernorm needs Transformer Engine": RecomputeConfig(granularity="selective", modules=["layernorm"]),
    }
    cfgs = [trainer_config(pp=2, recompute=recompute) for recompute in cases.values()]
    (messages,) = run_ranks(config_error_rank, 1, tmp_path, tiny["qwen3"], cfgs)
    for needle, message in zip(cases, messages):
        assert re.search(needle, message), message
