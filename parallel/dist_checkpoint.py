"""Trainer checkpoints through megatron-core's ``dist_checkpointing`` (torch_dist format).

Model, optimizer, LR schedule and RNG state, saved by every rank in parallel and loadable at another
tensor/pipeline/expert/data-parallel layout: parameters and optimizer state are saved as global
tensors (the distributed optimizer in its ``fully_reshardable`` form: gathered over
data-parallel ranks when saving, sliced per rank when loading; megatron-core 0.19 rejects the
flattened ranges of ``fully_sharded_model_space``). RNG states are per
rank; they are restored only when the layout is the same, as in Megatron-LM.

``dist_checkpointing.save`` writes ``metadata.json`` last, after every rank has written its files;
a folder without it is an incomplete checkpoint and ``load`` refuses it.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

from parallel.optim import use_fused_adam
from parallel.weights.placement import unwrap

log = logging.getLogger(__name__)

COMPLETE_MARKER = "metadata.json"
_SHARDING = {"distrib_optim_sharding_type": "fully_reshardable", "chained_optim_avoid_prefix": True}


def layout(pgs) -> dict[str, int]:
    """The parallel sizes a checkpoint was written with."""
    return {"tp": pgs.tp.size(), "pp": pgs.pp.size(), "ep": pgs.ep.size(), "dp": pgs.dp.size()}


def _rng_state() -> dict:
    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()},
    }


def _set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _rng_object(pgs) -> ShardedObject:
    """One RNG record per (pp, tp, ep) rank; data-parallel ranks other than 0 are replicas."""
    return ShardedObject(
        "rng_state",
        _rng_state(),
        (pgs.pp.size(), pgs.tp.size(), pgs.ep.size()),
        (pgs.pp.rank(), pgs.tp.rank(), pgs.ep.rank()),
        replica_id=pgs.dp.rank(),
    )


def _materialize_optimizer_state(optimizer) -> None:
    """Give a fresh distributed optimizer its Adam state before loading into it.

    Without Apex or TE (CPU, and the H200 image), ``DistributedOptimizer.state_dict``
    (``optimizer/distrib_optimizer.py:839``) asserts one shared ``step`` across the torch state,
    which an optimizer that never stepped lacks. Megatron's own zero-gradient step fills it (the
    values are replaced by the load).
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(opt, DistributedOptimizer) and not opt.optimizer.state:
            opt._init_optimizer_states_with_dummy_values()


def _skip_missing_step(optimizer) -> None:
    """Let a distributed optimizer load ``fully_reshardable`` state into torch Adam.

    ``load_parameter_state_from_fully_reshardable`` (``distrib_optimizer.py:2388``) leaves out
    Adam's ``step`` (restored from the common state) but ``_set_main_param_and_optimizer_states``
    (``:1222``) looks up every tensor of torch Adam's state, ``step`` included, and raises KeyError.
    A ``None`` step is skipped there. Patched on these instances only.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(opt, DistributedOptimizer):
            original = type(opt)._set_main_param_and_optimizer_states.__get__(opt)
            opt._set_main_param_and_optimizer_states = lambda p, t, f=original: f(p, {"step": None, **t})


def _sharded_state(model, optimizer, pgs, is_loading: bool, with_rng: bool) -> dict:
    model_sd = unwrap(model).sharded_state_dict(metadata=dict(_SHARDING))
    state = {
        "model": model_sd,
        "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=dict(_SHARDING)),
    }
    if with_rng:
        state["rng_state"] = _rng_object(pgs)
    return state


def save_trainer(path: str | Path, model, optimizer, scheduler, pgs, extra: dict | None = None) -> None:
    """Write this job's trainer state into ``path`` (collective: every rank calls it).

    ``extra`` is plain data saved once (identical on every rank), returned by :func:`load_trainer`.
    Raises RuntimeError if ``path`` is not complete afterwards.
    """
    state = _sharded_state(model, optimizer, pgs, is_loading=False, with_rng=True)
    state["scheduler"] = scheduler.state_dict()
    state["layout"] = layout(pgs)
    state["extra"] = dict(extra or {})
    _save(path, state, "trainer")


def _save(path: str | Path, state: dict, kind: str) -> None:
    """``dist_checkpointing.save`` between barriers; RuntimeError unless ``path`` is complete after."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(state, str(path))
    dist.barrier()
    if not (path / COMPLETE_MARKER).exists():
        raise RuntimeError(f"{kind} checkpoint {path}: save finished without {COMPLETE_MARKER}; it is incomplete")


def check_complete(path: str | Path) -> None:
    """ValueError unless ``path`` holds a complete trainer checkpoint."""
    path = Path(path)
    if not (path / COMPLETE_MARKER).exists():
        raise ValueError(
            f"trainer checkpoint {path} is missing or incomplete (no {COMPLETE_MARKER}): "
            "resume from the checkpoint the tracker names (megatron_rl.checkpoint.latest_checkpoint)"
        )


def load_trainer(path: str | Path, model, optimizer, scheduler, pgs) -> dict:
    """Restore model, optimizer, schedule (and RNG at the same layout) from ``path``; return ``extra``.

    Collective. The saved layout may differ from this job's.
    """
    check_complete(path)
    common = dist_checkpointing.load_common_state_dict(str(path))
    same_layout = common["layout"] == layout(pgs)
    if not same_layout:
        log.info("checkpoint %s: layout %s -> %s, RNG states not restored", path, common["layout"], layout(pgs))
    _materialize_optimizer_state(optimizer)
    _skip_missing_step(optimizer)
    state = _sharded_state(model, optimizer, pgs, is_loading=True, with_rng=same_layout)
    loaded = dist_checkpointing.load(state, str(path))
    unwrap(model).load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])
    use_fused_adam(optimizer)  # also undoes the load's one ``step`` tensor shared by every parameter
    scheduler.load_state_dict(loaded["scheduler"])
    if same_layout:
        _set_rng_state(loaded["rng_state"])
    return loaded["extra"]


def save_weights(path: str | Path, model, pgs) -> None:
    """Write only the model's weights into ``path`` (collective), loadable at another layout."""
    _save(path, {"model": unwrap(model).sharded_state_dict(), "layout": layout(pgs)}, "weights")


def load_weights(path: str | Path, model) -> None:
    """Restore what :func:`save_weights` wrote (collective)."""
    check_complete(path)
    loaded = dist_checkpointing.load({"model": unwrap(model).sharded_state_dict()}, str(path))
    unwrap(model).load_state_dict(loaded["model"])
