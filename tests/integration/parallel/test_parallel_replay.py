"""Routing replay: replayed forwards dispatch to the recorded experts for every token, even after
the router weights change; free routing after the change does not."""

from __future__ import annotations

import pytest
import torch
from parallel_launch import run_ranks
from parallel_ranks import replay_rank, trainer_config

from correction.routing_replay import RoutingReplayConfig
from megatron_rl.algorithms.config import AlgorithmConfig


def expected_map(recorded, rows, width, layer, num_experts):
    """[b, s, E] bool: the recorded experts of each real token."""
    out = torch.zeros(rows, width, num_experts, dtype=torch.bool)
    for r, rec in enumerate(recorded):
        out[r, : rec.num_tokens].scatter_(-1, rec.indices[:, layer], True)
    return out


@pytest.mark.parametrize("mode", ["r3", "r2"])
def test_replayed_experts_equal_recorded_after_router_change(mode, tiny, batch, tmp_path):
    algo = AlgorithmConfig(routing_replay=RoutingReplayConfig(mode=mode))
    ((recorded, (free, replayed, trained, own), metrics),) = run_ranks(
        replay_rank, 1, tmp_path, tiny["qwen3_moe"], trainer_config(max_tokens_per_micro_batch=64), algo, batch
    )
    rows, width = batch.input_ids.shape
    real = batch.attention_mask.bool()
    assert [r.num_tokens for r in recorded] == batch.attention_mask.sum(1).long().tolist()
    for forward in (replayed, trained):
        assert sorted(forward) == [0, 1]
        for layer, used in forward.items():
            want = expected_map(recorded, rows, width, layer, recorded[0].num_experts)
            assert torch.equal(used[real], want[real]), f"layer {layer}"
    differ = sum(int((used[real] != expected_map(recorded, rows, width, n, 4)[real]).any(-1).sum()) for n, used in free.items())
    assert differ > 0, "free routing after the router change should pick other experts somewhere"
    assert metrics["perf/loss_tokens"] == float(batch.loss_mask.sum())  # the replayed training pass ran
    # The training pass replayed the record on the changed routers; their own choice (from their logits,
    # the earlier layers replayed) differs from it where the metrics say.
    # A row's last token is left out (the sampler never forwards it; its record repeats the one before).
    counted = real.clone()
    counted[torch.arange(rows), real.sum(1).long() - 1] = False
    changed = torch.stack([(own[n][counted] != expected_map(recorded, rows, width, n, 4)[counted]).any(-1) for n in sorted(own)])
    assert torch.equal(changed[0], (free[0][counted] != expected_map(recorded, rows, width, 0, 4)[counted]).any(-1))
    assert metrics["routing/disagreement"] == pytest.approx(changed.float().mean().item())
    assert metrics["routing/tokens_differing"] == pytest.approx(changed.any(0).float().mean().item())
    assert 0 < metrics["routing/disagreement"] <= metrics["routing/tokens_differing"] <= 1


def test_disagreement_counts_every_pipeline_stage(tiny, batch, tmp_path_factory):
    """Each stage holds one of the two MoE layers: the metrics are reduced over stages, not per stage."""
    algo = AlgorithmConfig(routing_replay=RoutingReplayConfig(mode="r3"))
    one = run_ranks(replay_rank, 1, tmp_path_factory.mktemp("pp1"), tiny["qwen3_moe"], trainer_config(max_tokens_per_micro_batch=64), algo, batch)
    two = run_ranks(replay_rank, 2, tmp_path_factory.mktemp("pp2"), tiny["qwen3_moe"], trainer_config(pp=2, max_tokens_per_micro_batch=64), algo, batch)
    want = {k: v for k, v in one[0][2].items() if k.startswith("routing/")}
    assert len(want) == 2
    for _, _, metrics in two:
        assert {k: metrics[k] for k in want} == pytest.approx(want)
