"""DDP wrapping, megatron's (distributed) optimizer and its learning-rate schedule."""

from __future__ import annotations

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from parallel.config import TrainerConfig


def wrap_ddp(model, cfg: TrainerConfig, pg_collection) -> DistributedDataParallel:
    """Gradient buffers reduced over data-parallel ranks in float32 (reduce-scatter with ZeRO-1)."""
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=cfg.optimizer.use_distributed_optimizer,
    )
    return DistributedDataParallel(model.config, ddp_config, model, pg_collection=pg_collection)


def build_optimizer(ddp_model, cfg: TrainerConfig, pg_collection):
    """Adam (float32 master weights for bf16 models), grad clipping, and the LR schedule."""
    o = cfg.optimizer
    bf16 = cfg.dtype == "bfloat16"
    optimizer = get_megatron_optimizer(
        MegatronOptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            min_lr=o.min_lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.adam_beta1,
            adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps,
            clip_grad=o.clip_grad,
            bf16=bf16,
            params_dtype=torch.bfloat16 if bf16 else torch.float32,
            use_distributed_optimizer=o.use_distributed_optimizer,
        ),
        [ddp_model],
        use_gloo_process_groups=False,
        pg_collection=pg_collection,
    )
    use_fused_adam(optimizer)
    config = ddp_model.config
    config.no_sync_func = ddp_model.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    return optimizer, lr_scheduler(optimizer, cfg)


def use_fused_adam(optimizer) -> None:
    """Switch torch's Adam to its fused kernel; call after building and after loading state.

    Without Apex or Transformer Engine (neither is installed here nor on the H200), megatron-core
    falls back to ``torch.optim.AdamW`` with its default multi-tensor path, several kernels per
    tensor list; the fused kernel updates each parameter in one pass (on CPU and GPU alike). Fused
    Adam needs each parameter's ``step`` as its own float32 tensor on the parameter's device, while
    ``DistributedOptimizer.load_state_dict`` (``distrib_optimizer.py:1031``) hands every parameter
    one shared CPU tensor (any torch Adam would then increment it once per parameter and get bias
    correction wrong from the first step after a load), so each step gets its own tensor again.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        if not isinstance(inner, torch.optim.Adam):
            continue  # Apex / TE FusedAdam: already fused
        for group in inner.param_groups:
            group["fused"], group["foreach"] = True, False
            for p in group["params"]:
                state = inner.state.get(p)
                if state and "step" in state:
                    state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32, device=p.device)


def lr_scheduler(optimizer, cfg: TrainerConfig) -> OptimizerParamScheduler:
    """Linear warm-up to ``lr``, then constant, linear or cosine decay to ``min_lr``."""
    o = cfg.optimizer
    decay_steps = o.lr_decay_steps or 1
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if o.lr_warmup_steps else o.lr,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=o.lr_warmup_steps,
        lr_decay_steps=o.lr_warmup_steps + decay_steps,
        lr_decay_style=o.lr_decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )


class ConstantRate:
    """A stand-in for the schedule during steps at a rate of their own: holds ``lr`` (times each group's
    ``lr_mult``) and leaves the trainer's schedule, whose per-group ``max_lr`` would override it, untouched."""

    def __init__(self, optimizer, lr: float):
        self.optimizer, self.lr = optimizer, lr

    def step(self, increment: int) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * group.get("lr_mult", 1.0)
