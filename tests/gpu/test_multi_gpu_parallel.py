"""Megatron TP=2 equals TP=1 and EP=2 equals EP=1 on two GPUs (NCCL, bf16): the CPU parity tests' layouts.

A small Qwen3 (4 layers x 256, GQA 8/2) and Qwen3-MoE (4 experts, top-2), a batch of right-padded rows of
up to 96 tokens; log-probs and entropies of every token compared with the one-GPU run of the same
weights. bf16 on both sides, so the only differences are reduction order (TP all-reduces, the MoE
all-to-all's combine): tolerances below, max and mean absolute difference printed.

    export PYTHONPATH=$PWD:/tmp/site    # after .ci/gpu-install.sh /tmp/pieces /tmp/site (README: GPUs)
    python -m pytest tests/gpu/test_multi_gpu_parallel.py -s -p no:cacheprovider
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast must stay off on the H200 machines

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "parallel"))

from parallel_launch import run_ranks  # noqa: E402
from parallel_ranks import batch_of, logprobs_rank, trainer_config  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

# bf16, per token, nats: the TP/EP layouts only reorder bf16 reductions.
TOL_MAX = {"logp": 0.1, "entropy": 0.1}
TOL_MEAN = {"logp": 0.01, "entropy": 0.01}


def _batch():
    gen = torch.Generator().manual_seed(0)
    return batch_of([torch.randint(3, 4000, (n,), generator=gen).tolist() for n in (96, 57, 80, 33)], prompt_len=4)


def _cfg(world: int, **layout):
    return trainer_config(**layout, num_ranks=world, dtype="bfloat16", max_tokens_per_micro_batch=256)


@pytest.fixture(scope="module")
def models():
    from megatron_rl.tiny import make_tiny_model

    return {arch: str(make_tiny_model(arch, size="small", seed=0)) for arch in ("qwen3", "qwen3_moe")}


def _diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    d = (a.float().cpu() - b.float().cpu()).abs()[mask]
    return d.max().item(), d.mean().item()


@pytest.mark.parametrize("arch,layout", [("qwen3", dict(tp=2)), ("qwen3_moe", dict(ep=2)), ("qwen3_moe", dict(tp=2))],
                         ids=["qwen3-tp2", "qwen3_moe-ep2", "qwen3_moe-tp2"])
def test_two_gpu_layout_equals_one_gpu(arch, layout, models, tmp_path):
    batch = _batch()
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    ((logp1, ent1, _),) = run_ranks(logprobs_rank, 1, tmp_path / "one", [(models[arch], _cfg(1))], batch)[0]
    ranks = run_ranks(logprobs_rank, 2, tmp_path / "two", [(models[arch], _cfg(2, **layout))], batch)
    mask = batch.attention_mask.bool().clone()
    mask[:, 0] = False  # position 0 has no log-prob
    assert logp1.abs()[mask].min() > 0, "the one-GPU run must give every token a log-prob"
    failures = []
    for rank, ((logp, ent, _),) in enumerate(ranks):
        for what, a, b in (("logp", logp, logp1), ("entropy", ent, ent1)):
            worst, mean = _diff(a, b, mask)
            print(f"\n{arch} {layout} rank {rank} {what}: max |diff| {worst:.2e}, mean {mean:.2e} "
                  f"(tolerance max {TOL_MAX[what]}, mean {TOL_MEAN[what]}) over {int(mask.sum())} tokens")
            if worst > TOL_MAX[what] or mean > TOL_MEAN[what]:
                failures.append(f"rank {rank} {what}: max {worst:.3e} mean {mean:.3e}")
    assert not failures, f"{arch} {layout} differs from one GPU: {failures}"
