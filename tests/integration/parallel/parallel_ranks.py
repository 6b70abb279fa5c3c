"""Rank functions the parallel integration tests spawn (top level, so spawn can pickle them)."""

from __future__ import annotations

import torch

from parallel.config import ParallelConfig, TrainerConfig


def enable_cpu() -> None:
    """First thing in a rank: the CPU layer must be in place before megatron-core is imported."""
    from parallel import cpu_compat

    cpu_compat.enable()


def batch_of(ids: list[list[int]], prompt_len: int = 2):
    """A TrainingBatch of right-padded rows with every response token in the loss."""
    from megatron_rl.contracts import TrainingBatch

    width = max(len(r) for r in ids)
    rows = len(ids)
    input_ids = torch.zeros(rows, width, dtype=torch.long)
    attn = torch.zeros(rows, width)
    for b, r in enumerate(ids):
        input_ids[b, : len(r)] = torch.tensor(r)
        attn[b, : len(r)] = 1
    loss = attn.clone()
    loss[:, :prompt_len] = 0
    return TrainingBatch(
        input_ids=input_ids,
        attention_mask=attn,
        loss_mask=loss,
        advantages=torch.zeros(rows, width),
        rollout_logprobs=torch.zeros(rows, width),
        group_ids=torch.arange(rows),
        trajectory_ids=[f"t{b}" for b in range(rows)],
        prompt_lengths=torch.full((rows,), prompt_len),
    )


def trainer_config(tp=1, pp=1, ep=1, **kw) -> TrainerConfig:
    """The layout on the fewest ranks that hold it (``num_ranks`` is checked against it)."""
    kw.setdefault("num_ranks", tp * pp * ep)
    return TrainerConfig(
        parallel=ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep),
        **kw,
    )


def logprobs_rank(rank, world, init_method, cases, batch):
    """For each (hf_dir, cfg) in ``cases`` (one layout): (log-probs, entropy, exported HF tensors)."""
    enable_cpu()
    from parallel.groups import init_distributed
    from parallel.logprob_pass import compute_logprobs
    from parallel.provider import load_model
    from parallel.weights.hf_export import iter_hf_weights

    pgs = init_distributed(cases[0][1].parallel, rank, world, init_method)
    out = []
    for hf_dir, cfg in cases:
        model = load_model(hf_dir, cfg, pgs)
        logp, ent, _ = compute_logprobs(model, batch, cfg.max_tokens_per_micro_batch, pgs)
        out.append((logp, ent, dict(iter_hf_weights(model, pgs))))
    return out


def positive_nll(logp: torch.Tensor, batch) -> float:
    """Mean negative log-prob of the loss tokens with positive advantage."""
    pos = batch.loss_mask * (batch.advantages > 0)
    return float(-(logp * pos).sum() / pos.sum())


def train_rank(rank, world, init_method, hf_dir, cfg, algorithm, batch, steps):
    """Positive-advantage NLL before and after ``steps`` updates on ``batch``; the last metrics."""
    enable_cpu()
    from parallel.policy import MegatronPolicy

    policy = MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init_method)
    before = positive_nll(policy.compute_logprobs(batch)[0], batch)
    metrics = [policy.train_step(batch) for _ in range(steps)]
    after = positive_nll(policy.compute_logprobs(batch)[0], batch)
    return before, after, metrics


def lr_rank(rank, world, init_method, hf_dir, cfg, algorithm, batch, warm_lr, warm_steps, steps):
    """``policy/lr`` of ``warm_steps`` steps at ``warm_lr`` then ``steps`` steps on the trainer's schedule."""
    enable_cpu()
    from parallel.policy import MegatronPolicy

    policy = MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init_method)
    warm = [policy.train_step(batch, lr=warm_lr)["policy/lr"] for _ in range(warm_steps)]
    return warm, [policy.train_step(batch)["policy/lr"] for _ in range(steps)]


def _experts_used(policy):
    """Hooks on every router that keep the experts each forward actually dispatched to."""
    from parallel.weights.placement import unwrap

    used = []
    for layer in unwrap(policy.model).decoder.layers:
        layer.mlp.router.register_forward_hook(lambda m, i, out, n=layer.layer_number - 1: used.append((n, out[1].clone())))
    return used


def _own_choice(policy):
    """Hooks on every router that keep, as a routing map, the experts its own logits rank first, whatever
    it dispatched to."""
    from parallel.weights.placement import unwrap

    chosen = []

    def keep(router, inputs, _, n):
        logits = torch.nn.functional.linear(inputs[0].float(), router.weight.float())
        top = logits.reshape(-1, logits.shape[-1]).topk(router.topk, dim=-1).indices
        chosen.append((n, torch.zeros_like(logits.reshape(-1, logits.shape[-1]), dtype=torch.bool).scatter_(-1, top, True)))

    for layer in unwrap(policy.model).decoder.layers:
        layer.mlp.router.register_forward_hook(lambda m, i, o, n=layer.layer_number - 1: keep(m, i, o, n))
    return chosen


def _as_sets(used, rows, width):
    """layer -> bool routing maps ``[b, s, E]`` from the router hooks of one forward."""
    return {n: rmap.reshape(width, rows, -1).transpose(0, 1) for n, rmap in used}


def replay_rank(rank, world, init_method, hf_dir, cfg, algorithm, batch):
    """R3/R2 checks on one rank: recorded experts, free routing after a router change, replayed routing, and
    in the replayed training pass the routers' own choice."""
    enable_cpu()
    from parallel.policy import MegatronPolicy
    from parallel.weights.placement import unwrap

    policy = MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init_method)
    _, _, recorded = policy.compute_logprobs(batch, record_routing=True)
    with torch.no_grad():  # change every router (the same way in any layout): free routing now picks other experts
        for layer in unwrap(policy.model).decoder.layers:
            weight = layer.mlp.router.weight
            weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(layer.layer_number)) * 0.5)
    used = _experts_used(policy)
    free_batch = batch_with(batch, routed_experts=None)
    mode = policy.algorithm.routing_replay.mode
    policy.algorithm.routing_replay.mode = type(mode)("none")
    policy.compute_logprobs(free_batch)
    free = list(used)
    used.clear()
    policy.algorithm.routing_replay.mode = mode
    replay_batch = batch_with(batch, routed_experts=recorded)
    policy.compute_logprobs(replay_batch)
    replayed = list(used)
    used.clear()
    own = _own_choice(policy)
    metrics = policy.train_step(replay_batch)
    trained = list(used)
    rows, width = batch.input_ids.shape
    return recorded, [_as_sets(x, rows, width) for x in (free, replayed, trained, own)], metrics


def batch_with(batch, **changes):
    import dataclasses

    return dataclasses.replace(batch, **changes)


def checkpoint_rank(rank, world, init_method, hf_dir, cfg, algorithm, batch, load_from, save_to, hf_out, refuse=None):
    """Optionally load ``load_from``; log-probs; one step; optionally save (run checkpoint) and export HF;
    one more step; log-probs. Returns (log-probs at the checkpoint, after the next step, steps, memory,
    the ValueError message of loading ``refuse``)."""
    enable_cpu()
    from megatron_rl.checkpoint import save_checkpoint
    from parallel.policy import MegatronPolicy

    policy = MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init_method)
    refused = None
    if refuse is not None:
        try:
            policy.load(refuse)
        except ValueError as e:
            refused = str(e)
    if load_from is not None:
        policy.load(load_from)
    else:
        policy.train_step(batch)
    at_checkpoint = policy.compute_logprobs(batch)[0]
    if save_to is not None:
        save_checkpoint(save_to, policy.steps, policy.save, {"step": policy.steps}, keep=3)
    if hf_out is not None:
        policy.save_hf(hf_out)
    steps = policy.steps
    memory = policy.memory()
    policy.train_step(batch)
    return at_checkpoint, policy.compute_logprobs(batch)[0], steps, memory, refused


def stalled_save_rank(rank, world, init_method, hf_dir, cfg, algorithm, batch, root, stalled_flag):
    """Start a run checkpoint and stall it after the shard files are written, before ``metadata.json``
    (the file dist_checkpointing writes last), so the parent can SIGKILL it mid-save."""
    enable_cpu()
    import time
    from pathlib import Path

    from megatron.core.dist_checkpointing import serialization

    from megatron_rl.checkpoint import save_checkpoint
    from parallel.policy import MegatronPolicy

    def stall(*_args, **_kwargs):
        Path(stalled_flag).write_text("stalled")
        time.sleep(600)

    policy = MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init_method)
    policy.train_step(batch)
    policy.train_step(batch)
    serialization.save_config = stall
    save_checkpoint(root, policy.steps, policy.save, {"step": policy.steps}, keep=3)


def critic_rank(rank, world, init_method, hf_dir, cfg, critic_cfg, batch, returns, steps, save_to):
    """Initial values; per step (values before the step, metrics) on a fixed batch and returns; final
    values; the values of a fresh critic loaded from a checkpoint saved at the end."""
    enable_cpu()
    from parallel.critic import MegatronCritic

    critic = MegatronCritic(hf_dir, cfg, critic_cfg, rank, world, init_method)
    initial = critic.compute_values(batch)
    history = []
    for _ in range(steps):
        old = critic.compute_values(batch)
        history.append((old, critic.train_step(batch, returns, old)))
    final = critic.compute_values(batch)
    critic.save(save_to)
    fresh = MegatronCritic(hf_dir, cfg, critic_cfg, rank, world, init_method, pgs=critic.pgs)
    fresh.load(save_to)
    return initial, history, final, fresh.compute_values(batch)


def export_specs_rank(rank, world, init_method, hf_dir, cfg):
    """(name, shape, dtype) of every tensor this rank's ``export_weights`` yields."""
    enable_cpu()
    from megatron_rl.algorithms.config import AlgorithmConfig
    from parallel.policy import MegatronPolicy

    policy = MegatronPolicy(hf_dir, cfg, AlgorithmConfig(), rank, world, init_method)
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in policy.export_weights()]


def export_key_rank(rank, world, init_method, hf_dir, cfg, algorithm, batch):
    """``export_weights``' (static key, addresses): first, again, after a training step, after a parameter
    moved, and without row blocks; and whether the first export's tensors changed in place with the step."""
    enable_cpu()
    from parallel.policy import MegatronPolicy

    def keys(row_blocks=True):
        export = policy.export_weights(row_blocks=row_blocks)
        return export.static_key, export.addresses

    policy = MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init_method)
    seen = [keys() for _ in range(2)]
    exported = dict(policy.export_weights(row_blocks=True))
    before = {n: t.clone() for n, t in exported.items()}
    policy.train_step(batch)
    seen.append(keys())
    changed = sum(not torch.equal(before[n], t) for n, t in exported.items())
    param = next(p for p in policy.model.parameters() if p.dim() == 2)
    param.data = param.data.clone()  # an offload and reload would move it so
    seen.append(keys())
    seen.append(keys(row_blocks=False))
    return seen, changed, len(exported)


def recompute_rank(rank, world, init_method, hf_dir, cfgs, algorithm, batch):
    """For each config (one layout, differing only in recompute): one training step from the same
    weights; (metrics, router forwards during the step, this rank's HF tensors after it)."""
    enable_cpu()
    from megatron.core import parallel_state

    from parallel.policy import MegatronPolicy

    out = []
    for cfg in cfgs:
        policy = MegatronPolicy(hf_dir, cfg, algorithm, rank, world, init_method)
        used = _experts_used(policy) if policy.routing is not None else []
        metrics = policy.train_step(batch)
        out.append((metrics, len(used), dict(policy.export_weights())))
        parallel_state.destroy_model_parallel()  # the next policy builds the same groups again
    return out


def config_error_rank(rank, world, init_method, hf_dir, cfgs):
    """For each config, the ValueError message building its TransformerConfig raises ('' if none)."""
    enable_cpu()
    from parallel.provider import load_hf_config, transformer_config

    messages = []
    for cfg in cfgs:
        try:
            transformer_config(load_hf_config(hf_dir), cfg, None)
            messages.append("")
        except ValueError as err:
            messages.append(str(err))
    return messages


def reference_rank(rank, world, init_method, hf_dir, cfg, batch, steps, save_to):
    """Log-probs of the policy and its reference through snapshot, policy updates, save and load."""
    enable_cpu()
    from megatron_rl.algorithms.config import AlgorithmConfig
    from parallel.policy import MegatronPolicy
    from parallel.reference import ReferencePolicy

    policy = MegatronPolicy(hf_dir, cfg, AlgorithmConfig(), rank, world, init_method)
    reference = ReferencePolicy(policy)
    out = {"policy_start": policy.compute_logprobs(batch)[0], "reference_start": reference.compute_logprobs(batch)}
    for _ in range(steps):
        policy.train_step(batch)
    out["policy_trained"] = policy.compute_logprobs(batch)[0]
    out["reference_after_training"] = reference.compute_logprobs(batch)
    reference.save(save_to)
    reference.snapshot(policy)
    out["reference_snapshot"] = reference.compute_logprobs(batch)
    reference.load(save_to)
    out["reference_loaded"] = reference.compute_logprobs(batch)
    return out
