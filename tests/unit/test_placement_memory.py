"""The trainer memory estimate against megatron's own accounting (``parallel.memory``) on the tiny models,
and the shapes ``plan`` reads from config.json against the tiny checkpoints' real tensors."""

from __future__ import annotations

import math
import socket
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from megatron_rl.runtime.memory import trainer_static_bytes
from megatron_rl.runtime.shapes import hf_tensor_specs, num_experts, read_config
from megatron_rl.schedules.weight_sync import checkpoint_specs
from megatron_rl.tiny import make_tiny_model
from weight_transfer.layout import TrainerLayout


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "qwen3_moe", "llama"])
def test_shapes_from_config_are_the_checkpoints_tensors(arch):
    path = make_tiny_model(arch, size="unit", seed=0)
    got = {s.name: s.shape for s in hf_tensor_specs(read_config(path), "float32")}
    assert got == {s.name: s.shape for s in checkpoint_specs(path, "float32")}


def _rank(rank: int, world: int, port: int, out: str, hf_dir: str, tp: int, ep: int, etp: int | None) -> None:
    try:
        from parallel import cpu_compat

        cpu_compat.enable()
        from megatron_rl.algorithms.config import AlgorithmConfig
        from parallel.config import ParallelConfig, TrainerConfig
        from parallel.policy import MegatronPolicy

        layout = ParallelConfig(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                expert_tensor_parallel_size=etp)
        policy = MegatronPolicy(hf_dir, TrainerConfig(num_ranks=world, parallel=layout), AlgorithmConfig(), rank, world,
                                f"tcp://127.0.0.1:{port}")
        torch.save(_after_one_step(policy), Path(out, f"rank{rank}.pt"))
    except BaseException:
        Path(out, f"error{rank}.txt").write_text(traceback.format_exc())
        raise


def _after_one_step(policy) -> dict:
    """Adam's moments exist once a step has run."""
    from megatron_rl.contracts import TrainingBatch

    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])  # a row for each data-parallel rank
    ones = torch.ones_like(ids, dtype=torch.float32)
    batch = TrainingBatch(input_ids=ids, attention_mask=ones, loss_mask=ones, advantages=ones,
                          rollout_logprobs=torch.zeros_like(ones), group_ids=torch.arange(2),
                          trajectory_ids=["t0", "t1"], prompt_lengths=torch.tensor([1, 1]))
    policy.train_step(batch)
    return policy.memory()


def _megatron_memory(hf_dir: str, tp: int, ep: int, etp: int | None, out: Path) -> list[dict]:
    world = math.lcm(tp, (etp or tp) * ep)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, world, port, str(out), hf_dir, tp, ep, etp)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    errors = [e.read_text() for e in out.glob("error*.txt")]
    assert not errors, errors[0]
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.mark.parametrize(("arch", "tp", "ep", "etp"), [("qwen3", 2, 1, None), ("qwen3_moe", 1, 2, None),
                                                      ("qwen3_moe", 1, 1, 2)])
def test_static_memory_estimate_is_within_ten_percent_of_megatrons(arch, tp, ep, etp, tmp_path):
    """The last case folds experts differently from attention: each rank holds all of attention (TP=1, DP=2)
    and half of every expert's matrices (ETP=2)."""
    path = make_tiny_model(arch, size="unit", seed=0)
    config = read_config(path)
    world = math.lcm(tp, (etp or tp) * ep)
    layout = TrainerLayout(num_layers=config["num_hidden_layers"], tp=tp, dp=world // tp, ep=ep,
                           num_experts=num_experts(config), etp=etp)
    estimate = trainer_static_bytes(hf_tensor_specs(config, "float32"), layout, "float32")
    measured = _megatron_memory(str(path), tp, ep, etp, tmp_path)
    busiest = max(measured, key=lambda m: m["params"] + m["grads"] + m["optimizer"])
    for key, theirs in (("weights", busiest["params"]), ("grads", busiest["grads"]), ("optimizer", busiest["optimizer"])):
        assert abs(estimate[key] - theirs) <= 0.10 * theirs, (key, estimate, busiest)
