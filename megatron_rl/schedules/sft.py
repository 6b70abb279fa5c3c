"""Supervised warm start: cross-entropy on the environments' reference replies, before RL.

A random-initialised model earns no reward on most tasks (every group has zero variance, so no
signal); real recipes start from an instruction-tuned checkpoint, the tiny ones from a short SFT.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from correction.config import CorrectionConfig
from correction.routing_replay import RoutingReplayConfig
from megatron_rl.algorithms.config import KLConfig
from megatron_rl.console import bar
from megatron_rl.contracts import PromptItem, TrainingBatch, Trajectory, TrajectoryId
from megatron_rl.data.sampler import PromptSampler
from megatron_rl.envs.registry import get_env_class
from megatron_rl.schedules.components import Components
from megatron_rl.schedules.evaluation import greedy_scores, pass_rate

log = logging.getLogger("megatron_rl")


def demonstration(c: Components, item: PromptItem, index: int) -> Trajectory:
    """The prompt exactly as the generator renders it, then the reference reply and end-of-turn token."""
    renderer = c.generator.renderer(item.env_class)
    reply = get_env_class(item.env_class).reference_reply(item.env_extras)
    reply_ids = c.generator.tokenizer.encode(reply, add_special_tokens=False) + [renderer.eos_id]
    return Trajectory(
        trajectory_id=TrajectoryId(f"sft-{item.instance_id}", index),
        prompt_token_ids=renderer.prompt_ids(item.prompt),
        response_ids=reply_ids,
        loss_mask=[1] * len(reply_ids),
        rewards=1.0,
        rollout_logprobs=[0.0] * len(reply_ids),
        policy_versions=[0] * len(reply_ids),
    )


async def run_sft(c: Components, sampler: PromptSampler) -> tuple[dict[str, float], int]:
    """Up to ``sft.steps`` cross-entropy steps, fewer when ``sft.stop_at_accuracy`` is reached; returns the
    last step's ``sft/*`` metrics and the weight version the fleet serves (0: the checks never synced)."""
    cfg = c.config.sft
    # Demonstrations have no sampler routing to replay (experts route freely) and no reference yet:
    # the reference is the policy SFT ends with.
    loss = dataclasses.replace(c.config.algorithm, policy_loss_type="cross_entropy", correction=CorrectionConfig(),
                               routing_replay=RoutingReplayConfig(), kl=KLConfig())
    checked = sampler.items[:cfg.check_prompts] if cfg.stop_at_accuracy else []
    metrics: dict[str, float] = {}
    check: dict[str, float] = {}  # the last greedy check: every line up to the next one shows it
    version = 0
    progress = bar(cfg.steps, "sft")
    for step in range(cfg.steps):
        start = time.perf_counter()
        items = sampler.next_batch(cfg.batch_size)
        demos = [demonstration(c, item, i) for i, item in enumerate(items)]
        advantages = [[1.0] * len(t.response_ids) for t in demos]
        batch = TrainingBatch.from_trajectories(demos, advantages, list(range(len(demos))), c.pad_token_id)
        out = c.policy.train_step(batch, loss, lr=cfg.lr)
        # demonstrations carry no sampler log-probs: no rollout/trainer mismatch to report
        metrics = {f"sft/{k.split('/', 1)[-1]}": v for k, v in out.items() if not k.startswith("policy/rollout_train_")}
        metrics["sft/seconds"] = time.perf_counter() - start
        metrics["sft/steps"] = float(step + 1)
        progress.update()
        reached = False
        if checked and (step + 1) % cfg.check_every == 0:
            version += 1
            await c.weight_sync(version)
            check = {"sft/check_pass_rate": pass_rate(await greedy_scores(c, checked, 0, version)),
                     "sft/check_step": float(step)}
            reached = check["sft/check_pass_rate"] >= cfg.stop_at_accuracy
        metrics.update(check)
        if reached:
            log.info("sft: stopped after %d steps, greedy pass rate %.3f on %d training prompts (target %.3f)",
                     step + 1, check["sft/check_pass_rate"], len(checked), cfg.stop_at_accuracy)
            break
        if step % 10 == 0 or step + 1 == cfg.steps:
            c.tracker.log_sft(step, metrics)
    progress.close()
    return metrics, version
