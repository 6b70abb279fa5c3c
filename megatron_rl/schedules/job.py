"""``megatron-rl train``: build the rooms from the config, warm-start, resume, run the schedule, clean up."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
from pathlib import Path

import torch

from megatron_rl import console
from megatron_rl.checkpoint import latest_checkpoint
from megatron_rl.config import to_yaml
from megatron_rl.config.schema import TrainConfig
from megatron_rl.data.sampler import PromptSampler
from megatron_rl.generator.generator import Generator
from megatron_rl.inference.fleet import InferenceFleet
from megatron_rl.inference.launcher import on_cpu
from megatron_rl.run_folder import RunFolder
from megatron_rl.run_summary import summary_lines
from megatron_rl.runtime.plan import reserve
from megatron_rl.schedules import data_setup
from megatron_rl.schedules.components import Components, LoopState
from megatron_rl.schedules.sft import run_sft
from megatron_rl.schedules.fully_async import run_fully_async
from megatron_rl.schedules.one_step_async import run_one_step_async
from megatron_rl.schedules.sync import run_sync
from megatron_rl.schedules.weight_sync import FleetWeightSync, build_plan
from megatron_rl.tracking import Tracker

log = logging.getLogger("megatron_rl")
SCHEDULES = {"sync": run_sync, "one_step_async": run_one_step_async, "fully_async": run_fully_async}
WORKER_EXTENSION = "megatron_rl.inference.worker_extension.MegatronRLWorkerExtension"


def fleet_config(cfg: TrainConfig, model_path: str, root: Path):
    """The inference fleet's config for serving ``model_path`` under the run folder ``root``: the run's dtype
    (unless ``inference.server.dtype`` sets the sampler's own) and seed, the weight-receiving worker extension, room for the longest prompt, and how R3 gets its routes."""
    run_dir = cfg.inference.server.run_dir or str(root / "inference")
    routes = cfg.inference.server.routed_experts
    if routes == "auto":
        routes = "native" if cfg.algorithm.routing_replay.mode.value == "r3" and not on_cpu() else "hooks"
    server = dataclasses.replace(
        cfg.inference.server, model_path=model_path, dtype=cfg.inference.server.dtype or cfg.model.dtype,
        seed=cfg.run.seed, run_dir=run_dir,
        worker_extension=cfg.inference.server.worker_extension or WORKER_EXTENSION,
        max_model_len=max(cfg.inference.server.max_model_len, cfg.generator.max_input_length), routed_experts=routes,
    )
    return dataclasses.replace(cfg.inference, server=server)


def _check(cfg: TrainConfig) -> None:
    """Problems a user can cause, reported before any process starts."""
    from megatron_rl.envs import get_env_class

    for name, options in cfg.envs.items():
        get_env_class(name).make_config(options)
    if cfg.trainer.dtype != cfg.model.dtype:
        raise ValueError(f"trainer.dtype={cfg.trainer.dtype} differs from model.dtype={cfg.model.dtype}; set both")


async def _train(cfg: TrainConfig, folder: RunFolder, tracker: Tracker) -> LoopState:
    import transformers

    from parallel.worker_group import WorkerGroup, start_ray

    model_path = cfg.model.resolve_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    hf_config = transformers.AutoConfig.from_pretrained(model_path)
    train, evals, data_metrics = data_setup.prompts(cfg, folder.root, tokenizer)
    sampler = PromptSampler(train, seed=cfg.run.seed, shuffle=cfg.data.shuffle)
    world = cfg.trainer.num_ranks
    algo = cfg.algorithm
    reserved = reserve(cfg)  # a placement that cannot fit the cluster fails here, before any actor starts
    build = functools.partial(WorkerGroup, model_path, cfg.trainer, algo, world_size=world,
                              critic=cfg.critic if algo.advantage_estimator == "gae" else None,
                              reference=algo.kl.needs_reference, resources=cfg.placement.trainer_resources,
                              actor_options=reserved.options("trainer", world))
    start_ray()  # here, in the main thread
    # On CPU the ranks build while the servers start (each takes a core for tens of seconds); a GPU engine
    # sizes its memory from what is free when it starts, so there the trainer takes its share first.
    building = asyncio.ensure_future(asyncio.to_thread(build) if on_cpu() else _ready(build()))
    policy = None
    try:
        async with InferenceFleet(fleet_config(cfg, model_path, folder.root), cfg.placement,
                                  reserved.options("inference", cfg.inference.num_servers)) as fleet:
            policy = await building
            log.info("trainer: %d rank(s) on nodes %s, rendezvous %s", world, policy.nodes, policy.init_method)
            plan = build_plan(Path(model_path), hf_config, cfg.trainer, world, cfg.weight_transfer.bucket_bytes)
            generator = Generator(fleet, tokenizer, cfg.generator, vocab_size=hf_config.vocab_size,
                                  env_configs=cfg.envs, num_experts=getattr(hf_config, "num_experts", None),
                                  return_routed_experts=cfg.algorithm.routing_replay.mode.value == "r3",
                                  seed=cfg.run.seed)
            weight_sync = FleetWeightSync(cfg.weight_transfer, plan, policy, fleet,
                                          colocated=cfg.placement.layout == "colocated")
            c = Components(cfg, generator, policy, weight_sync, sampler, evals, folder, tracker,
                           tokenizer.pad_token_id or 0)
            state = await _start(c, data_metrics)
            with tracker.phase("rl"):
                return await SCHEDULES[cfg.schedule.type](c, state)
    finally:
        if policy is None and not building.cancelled():  # the fleet failed first: stop the ranks once built
            policy = (await asyncio.gather(building, return_exceptions=True))[0]
        if isinstance(policy, WorkerGroup):
            policy.shutdown()
        reserved.release()


async def _ready(value):
    return value


async def _start(c: Components, data_metrics: dict) -> LoopState:
    """Resume from the latest checkpoint, or warm-start with SFT; either way the fleet then serves the trainer's weights."""
    cfg = c.config
    found = latest_checkpoint(c.folder.root / "checkpoints") if cfg.run.resume == "latest" else None
    if found is not None:
        path, loop = found
        c.policy.load(path / "trainer")
        state = LoopState(step=loop["step"], version=loop["version"], data=loop["data"], async_state=loop.get("async", {}))
        c.train_data.load_state_dict(state.data)
        log.info("resumed from %s (step %d, weight version %d)", path, state.step, state.version)
        await c.weight_sync(state.version)
        return state
    state = LoopState()
    if cfg.sft.steps:
        with c.tracker.phase("sft"):
            sft_metrics, checked_version = await run_sft(c, PromptSampler(c.train_data.items, seed=cfg.run.seed + 1))
            if cfg.algorithm.kl.needs_reference:
                c.policy.snapshot_reference()  # KL anchors RL to the model it starts from
            state.version = checked_version + 1
            sync = await c.weight_sync(state.version)
        c.tracker.log(0, {**data_metrics, **sft_metrics, **sync})
    return state


def train(cfg: TrainConfig) -> Path:
    """Run the configured job; returns the run folder."""
    _check(cfg)
    start = time.perf_counter()
    console.setup(cfg.run.verbose)
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    folder = RunFolder(Path(cfg.run.output_dir) / cfg.run.name, resume=cfg.run.resume == "latest")
    folder.write_config(to_yaml(cfg))
    tracker = Tracker(folder, cfg.run.name, cfg.run.wandb_project, dataclasses.asdict(cfg), cfg.schedule.total_steps)
    try:
        asyncio.run(_train(cfg, folder, tracker))
    finally:
        curves = tracker.finish()
        tracker.phases["total"] = time.perf_counter() - start
        for line in summary_lines(folder.read_metrics(), tracker.phases, folder.root, curves):
            log.info(line)
    return folder.root
