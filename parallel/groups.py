"""Process groups: torch.distributed, then megatron's model-parallel groups, returned explicitly."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from parallel import cpu_compat
from parallel.config import ParallelConfig


def init_distributed(
    parallel: ParallelConfig, rank: int, world_size: int, init_method: str, timeout_s: float = 600.0
):
    """Join the job (NCCL on GPU, gloo on CPU) and build the groups; return megatron's ProcessGroupCollection.

    Call once per process, before building a model. ``init_method`` is a ``tcp://host:port`` URL.
    """
    parallel.check_world(world_size)
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        cpu_compat.enable()
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if on_gpu else "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        expert_model_parallel_size=parallel.expert_model_parallel_size,
        expert_tensor_parallel_size=parallel.expert_tensor_parallel_size,
        create_gloo_process_groups=True,
    )
    model_parallel_cuda_manual_seed(parallel.seed)
    return ProcessGroupCollection.use_mpu_process_groups()


def destroy_distributed() -> None:
    """Leave the job and forget megatron's groups (tests run several layouts in one process)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
