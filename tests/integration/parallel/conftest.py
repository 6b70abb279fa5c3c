"""Fixtures of the Megatron integration tests: tiny HF checkpoints, a batch, a rank launcher."""

from __future__ import annotations

import pytest
import torch

from megatron_rl.tiny import make_tiny_model
from parallel_ranks import batch_of


@pytest.fixture(scope="session")
def tiny():
    """arch -> tiny "unit" checkpoint directory (built once, cached)."""
    return {arch: str(make_tiny_model(arch, size="unit", seed=0)) for arch in ("qwen2", "qwen3", "qwen3_moe", "llama")}


@pytest.fixture(scope="session")
def batch():
    """Three right-padded rows of different lengths (12, 7, 9 tokens), prompts of 2 tokens."""
    g = torch.Generator().manual_seed(0)
    return batch_of([torch.randint(3, 2000, (n,), generator=g).tolist() for n in (12, 7, 9)])
