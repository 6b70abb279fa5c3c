"""The reference policy (TP=2): equal to the policy when built, untouched by policy updates, equal to
the policy again after a snapshot, and restored exactly from its checkpoint."""

from __future__ import annotations

import torch
from parallel_launch import run_ranks
from parallel_ranks import batch_of, reference_rank, trainer_config

from parallel.config import OptimizerConfig


def test_reference_is_a_frozen_snapshot_that_survives_a_checkpoint(tiny, tmp_path):
    g = torch.Generator().manual_seed(3)
    batch = batch_of([torch.randint(3, 2000, (n,), generator=g).tolist() for n in (10, 8, 9)], prompt_len=3)
    batch.advantages = batch.loss_mask * torch.tensor([1.0, -1.0, 1.0])[:, None]
    cfg = trainer_config(tp=2, max_tokens_per_micro_batch=20, optimizer=OptimizerConfig(lr=3e-3))
    ranks = run_ranks(reference_rank, 2, tmp_path, tiny["qwen3"], cfg, batch, 3, tmp_path / "reference")
    for out in ranks:
        close = lambda a, b: torch.allclose(out[a], out[b], atol=1e-6)  # noqa: E731
        assert close("reference_start", "policy_start")
        assert (out["policy_trained"] - out["policy_start"]).abs().max() > 1e-2, "the policy must move"
        assert close("reference_after_training", "reference_start"), "policy updates leaked into the reference"
        assert close("reference_snapshot", "policy_trained")
        assert close("reference_loaded", "reference_start")
    assert torch.equal(ranks[0]["reference_loaded"], ranks[1]["reference_loaded"])
