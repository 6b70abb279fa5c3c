"""One trajectory's rollout: sample a turn, let the environment act, append its observation, repeat."""

from __future__ import annotations

import asyncio
import inspect
import time
import zlib
from dataclasses import dataclass, field

import torch

from correction.routing_replay import RoutedExperts
from megatron_rl.contracts import PromptItem, Trajectory, TrajectoryId
from megatron_rl.envs.base import TaskBug
from megatron_rl.generator.chat import ChatRenderer
from megatron_rl.generator.config import GeneratorConfig
from megatron_rl.inference.types import GenerationRequest, GenerationResult, SamplingParams


class EnvFailure(RuntimeError):
    """The environment raised or timed out: the rollout is retried from the start."""


@dataclass
class EpisodeState:
    """The growing token arrays of one episode; observations carry mask 0 and log-prob 0."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=lambda: {"llm": 0.0, "env": 0.0})
    experts: tuple[list, int] | None = None
    """The last turn's routed experts and the position they start at (the sampler's R3 record)."""

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def add_action(self, result: GenerationResult, version: int) -> None:
        n = len(result.token_ids)
        self.response_ids += result.token_ids
        self.loss_mask += [1] * n
        self.logprobs += result.logprobs
        self.versions += [version] * n
        self.rewards += [0.0] * n
        self.experts = (result.routed_experts, result.routed_experts_start) if result.routed_experts else None

    def add_observation(self, ids: list[int], version: int) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [version] * len(ids)
        self.rewards += [0.0] * len(ids)


@dataclass
class EpisodeContext:
    """What every episode of a batch shares."""

    fleet: object
    """Has ``async generate(GenerationRequest) -> GenerationResult``."""
    renderers: dict[str, ChatRenderer]
    """One renderer per env class (each renders its own tools in the system turn)."""
    config: GeneratorConfig
    temperature: float
    step: int
    policy_version: int
    """The version the fleet serves at the start, for a fleet that does not tag its replies."""
    seed: int = 0
    """Run seed: each turn samples with a seed derived from it, the step, the trajectory and the turn,
    so a resumed or repeated run draws the same samples whatever the request order."""
    num_experts: int | None = None
    """MoE only: experts per layer, to validate routed-expert records."""
    return_routed_experts: bool = False
    """Ask the fleet for each token's routed experts (R3 routing replay)."""


async def _env_call(ctx: EpisodeContext, state: EpisodeState, fn, *args):
    """``fn(*args)``: a plain method runs in a thread under ``generator.env_timeout_s``; a coroutine (a remote
    env) is awaited and keeps its own deadlines (a reset may wait for a restarting server)."""
    start = time.perf_counter()
    try:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), ctx.config.env_timeout_s)
    except TaskBug:
        raise  # a broken task is not retried: the step stops with the environment's message
    except asyncio.TimeoutError:
        raise EnvFailure(f"{getattr(fn, '__qualname__', fn)} timed out after {ctx.config.env_timeout_s}s") from None
    except Exception as err:  # an environment's own error: retried as a fresh sample
        raise EnvFailure(f"{type(err).__name__}: {err}") from err
    finally:
        state.timing["env"] += time.perf_counter() - start


async def _sample(ctx: EpisodeContext, state: EpisodeState, tid: TrajectoryId, turn: int) -> GenerationResult:
    cfg = ctx.config
    budget = cfg.max_input_length - state.length
    seed = zlib.crc32(f"{ctx.seed}:{ctx.step}:{tid}:{turn}".encode()) & 0x7FFFFFFF if cfg.seeded_sampling else None
    params = SamplingParams(
        max_tokens=min(cfg.max_tokens_per_turn, budget), temperature=ctx.temperature, top_p=cfg.top_p, seed=seed
    )
    start = time.perf_counter()
    result = await ctx.fleet.generate(
        GenerationRequest(state.prompt_ids + state.response_ids, params, session_id=str(tid),
                          return_routed_experts=ctx.return_routed_experts)
    )
    state.timing["llm"] += time.perf_counter() - start
    return result


async def run_episode(ctx: EpisodeContext, item: PromptItem, env, tid: TrajectoryId) -> Trajectory:
    """Roll out one episode against ``env`` (already built for ``item``); raises EnvFailure."""
    state = EpisodeState(prompt_ids=[])
    renderer = ctx.renderers[item.env_class]
    messages, _ = await _env_call(ctx, state, env.init, item.prompt)
    state.prompt_ids = renderer.prompt_ids(messages)
    if state.length >= ctx.config.max_input_length:
        raise ValueError(
            f"trajectory {tid}: prompt of {state.length} tokens leaves no room under generator.max_input_length; "
            "filter long prompts (data.max_prompt_length)"
        )
    stop_reason = "max_turns"
    for turn in range(ctx.config.max_turns):
        result = await _sample(ctx, state, tid, turn)
        version = _version(result, ctx)
        state.add_action(result, version)
        step = await _env_call(ctx, state, env.step, renderer.decode(result.token_ids))
        state.rewards[-1] += step.reward or 0.0
        if step.done or result.stop_reason == "abort":
            stop_reason = "stop" if result.stop_reason == "stop" else result.stop_reason
            break
        if turn + 1 == ctx.config.max_turns:
            break
        # A turn cut at max_tokens has no end-of-turn token: the template's one is appended (mask 0,
        # it was not sampled) so the observation turn renders as it would after a finished reply.
        closing = [] if result.token_ids[-1:] == [renderer.eos_id] else [renderer.eos_id]
        obs_ids = closing + renderer.observation_ids(step.observations)
        if state.length + len(obs_ids) >= ctx.config.max_input_length:
            stop_reason = "max_input_length"
            break
        state.add_observation(obs_ids, version)
    if stop_reason in TRUNCATED:
        _score_truncated(state, env)
    return _trajectory(ctx, tid, state, stop_reason, env, item.data_source)


TRUNCATED = ("length", "max_input_length")
"""Stop reasons of an episode cut off before it finished: its reply ran out of tokens or of context."""


def _score_truncated(state: EpisodeState, env) -> None:
    """A cut-off episode is scored as its environment defines (``score_truncated()``), zero by default:
    a reply that never finished earns nothing for what it happened to contain."""
    score = getattr(env, "score_truncated", None)
    state.rewards = [0.0] * len(state.rewards)
    state.rewards[-1] = float(score()) if score is not None else 0.0


def _version(result: GenerationResult, ctx: EpisodeContext) -> int:
    tag = result.weight_version
    return int(tag) if tag is not None and tag.isdigit() else ctx.policy_version


def _trajectory(ctx: EpisodeContext, tid: TrajectoryId, state: EpisodeState, stop_reason: str, env,
                data_source: str | None) -> Trajectory:
    return Trajectory(
        trajectory_id=tid,
        prompt_token_ids=state.prompt_ids,
        response_ids=state.response_ids,
        loss_mask=state.loss_mask,
        rewards=state.rewards,
        rollout_logprobs=state.logprobs,
        policy_versions=state.versions,
        group_step=ctx.step,
        stop_reason=stop_reason,
        timing=state.timing,
        env_metrics=dict(getattr(env, "metrics", {}) or {}),
        data_source=data_source,
        routed_experts=_routed_experts(state, ctx.num_experts),
    )


def _routed_experts(state: EpisodeState, num_experts: int | None) -> RoutedExperts | None:
    """The sampler's routing for every token, or None when it does not cover them all (a prefix served
    from cache, a trailing observation). The last sampled token is never forwarded by the sampler; its
    routing only shapes logits no loss reads, so the previous token's is repeated for it."""
    if state.experts is None or not num_experts:
        return None
    rows, start = state.experts
    if start != 0 or len(rows) != state.length - 1:
        return None
    indices = torch.tensor(rows + rows[-1:], dtype=torch.long)
    return RoutedExperts(indices, num_experts)

