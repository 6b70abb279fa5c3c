"""``megatron-rl plan``: the placement, per-GPU memory and weight-transfer projection of a recipe on a cluster
described on the command line, computed from the model's config.json alone; nothing is started."""

from __future__ import annotations

from pathlib import Path

from megatron_rl.config.load import RECIPES_DIR
from megatron_rl.config.schema import TrainConfig
from megatron_rl.runtime.cluster import Cluster
from megatron_rl.runtime.memory import activation_bytes, engine_bytes, trainer_static_bytes
from megatron_rl.runtime.placement import BundleGroup, Placement, place
from megatron_rl.runtime.shapes import hf_tensor_specs, num_experts, read_config
from parallel.config import TrainerConfig
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TransferPlan, natural_key

GB = 1e9


def _size(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB" if nbytes >= 0.1 * GB else f"{nbytes / 1e6:.2f} MB"


def model_dir(cfg: TrainConfig) -> Path:
    """``model.path`` (a relative path that does not exist here is read relative to ``recipes/``), or the tiny model."""
    if not cfg.model.path:
        return Path(cfg.model.resolve_path())
    path = Path(cfg.model.path)
    return path if path.is_absolute() or path.exists() else RECIPES_DIR / path


def trainer_layout(trainer: TrainerConfig, world_size: int, num_layers: int, num_experts: int) -> TrainerLayout:
    """Where the trainer's ``world_size`` ranks hold each tensor (``trainer.parallel``, expert TP included)."""
    p = trainer.parallel
    p.check_world(world_size)
    p.check_model(num_experts)
    return TrainerLayout(num_layers=num_layers, tp=p.tensor_model_parallel_size, pp=p.pipeline_model_parallel_size,
                         dp=world_size // p.model_parallel_size(), ep=p.expert_model_parallel_size,
                         num_experts=num_experts, etp=p.expert_tensor_parallel_size)


def bundle_groups(cfg: TrainConfig, cluster: Cluster) -> list[BundleGroup]:
    """One bundle per trainer rank and per engine; GPUs only where the cluster has them (CPU runs place by labels)."""
    gpu = 0 if cluster.gpu_kind == "CPU" else 1
    pl, server = cfg.placement, cfg.inference.server
    return [
        BundleGroup("trainer", cfg.trainer.num_ranks, gpu, 0, pl.trainer_strategy, dict(pl.trainer_resources),
                    "trainer.num_ranks"),
        BundleGroup("inference", cfg.inference.num_servers, gpu * server.tensor_parallel_size, 0, pl.inference_strategy,
                    dict(pl.server_resources), "inference.num_servers x inference.server.tensor_parallel_size"),
    ]


def placement_of(cfg: TrainConfig, cluster: Cluster) -> Placement:
    return place(bundle_groups(cfg, cluster), cluster, cfg.placement.layout)


def _transfer(cfg: TrainConfig, plan: TransferPlan, placement: Placement, cluster: Cluster) -> list[str]:
    sent: dict[str, int] = {}
    for bucket in plan.buckets:
        node = placement.nodes["trainer"][bucket.sender]
        sent[node] = sent.get(node, 0) + bucket.nbytes
    engine_nodes = sorted(set(placement.nodes["inference"]), key=natural_key)
    crosses = set(engine_nodes) != set(sent) or len(sent) > 1  # some bytes leave their node
    egress = max(sent.values())
    seconds = plan.nbytes / cluster.intra_node_bytes_s  # every engine GPU takes the whole model inside its node
    if crosses:
        seconds = max(seconds, egress / cluster.network_bytes_s, plan.nbytes / cluster.network_bytes_s)
    return [
        f"weight transfer ({cfg.weight_transfer.transport.type}): {_size(plan.nbytes)} in {len(plan.buckets)} "
        f"bucket(s) of <= {cfg.weight_transfer.bucket_size_mb} MiB from {len(plan.senders)} sender rank(s)",
        "  bytes per link: " + ", ".join(f"{n} out {_size(sent[n])}" for n in sorted(sent, key=natural_key))
        + "; " + ", ".join(f"{n} in {_size(plan.nbytes)}" for n in engine_nodes),
        f"  projected: {seconds * 1e3:.1f} ms (network {cluster.network_gbit_s:g} Gb/s per node, "
        f"{cluster.intra_node_bytes_s / GB:g} GB/s inside a node; bandwidth only, no latency or load)",
    ]


def _memory(cfg: TrainConfig, config: dict, specs, layout: TrainerLayout, cluster: Cluster) -> list[str]:
    static = trainer_static_bytes(specs, layout, cfg.trainer.dtype, cfg.trainer.optimizer.use_distributed_optimizer)
    tokens = cfg.trainer.max_tokens_per_micro_batch
    act = activation_bytes(config, layout, cfg.trainer.dtype, tokens, cfg.trainer.recompute.granularity)
    total = sum(static.values()) + act
    server = cfg.inference.server
    engine = engine_bytes(specs, config, server.tensor_parallel_size, cluster.gpu_bytes, server.gpu_memory_utilization,
                          cfg.model.dtype)
    room = f" of {cluster.gpu_bytes / GB:.0f} GB" if cluster.gpu_bytes else ""
    fits = "" if not cluster.gpu_bytes else (" (fits)" if total <= cluster.gpu_bytes else " (DOES NOT FIT)")
    lines = [f"trainer memory per GPU (busiest rank): weights {_size(static['weights'])}, grads "
             f"{_size(static['grads'])}, optimizer {_size(static['optimizer'])}, activations "
             f"{_size(act)} ({tokens} tokens per micro-batch, recompute {cfg.trainer.recompute.granularity or 'none'}) "
             f"= {_size(total)}{room}{fits}"]
    if cluster.gpu_bytes:
        verdict = "" if engine["fits"] else " (DOES NOT FIT: weights leave no KV cache)"
        lines.append(f"engine memory per GPU (TP={server.tensor_parallel_size}): weights {_size(engine['weights'])}, "
                     f"KV cache {_size(engine['kv_cache'])} = {engine['kv_tokens']:,} tokens at "
                     f"gpu_memory_utilization {server.gpu_memory_utilization}{verdict}")
    return lines


def render(cfg: TrainConfig, cluster: Cluster) -> str:
    """The whole plan as text; PlacementError (a ValueError) when the layout does not fit."""
    config = read_config(model_dir(cfg))
    specs = hf_tensor_specs(config, cfg.trainer.dtype)
    experts = num_experts(config)
    layout = trainer_layout(cfg.trainer, cfg.trainer.num_ranks, config["num_hidden_layers"], experts)
    placement = placement_of(cfg, cluster)
    params = sum(s.nbytes for s in specs) / (2 if cfg.trainer.dtype == "bfloat16" else 4)
    active = params if not experts else params - sum(
        s.nbytes for s in specs if ".experts." in s.name) / (2 if cfg.trainer.dtype == "bfloat16" else 4) * (
        1 - config["num_experts_per_tok"] / experts)
    plan = TransferPlan.build(specs, layout, cfg.weight_transfer.bucket_bytes)
    lines = [f"plan: {cfg.run.name} on {cluster.describe()}",
             f"model: {config['architectures'][0]}, {params / 1e9:.1f}B parameters ({active / 1e9:.1f}B active), "
             f"{cfg.trainer.dtype}",
             f"trainer: {cfg.trainer.num_ranks} ranks, TP={layout.tp} PP={layout.pp} EP={layout.ep} DP={layout.dp}"
             + (f" ETP={layout.expert_tp}" if experts else "") + "; "
             f"inference: {cfg.inference.num_servers} engine(s) x TP={cfg.inference.server.tensor_parallel_size}",
             f"placement ({placement.layout}):", *("  " + line for line in placement.table())]
    lines += _memory(cfg, config, specs, layout, cluster)
    lines += _transfer(cfg, plan, placement, cluster)
    return "\n".join(lines)


def reserve(cfg: TrainConfig):
    """Before any actor starts: check the run's placement against the live Ray cluster (labels present, GPUs
    enough; a PlacementError names what is missing), then reserve it as Ray placement groups. Only where the
    config places processes (Ray-launched servers or node labels); a one-host run with its servers beside the
    driver has nothing to place."""
    from megatron_rl.runtime.ray_groups import Reserved

    pl = cfg.placement
    if pl.servers != "ray" and not pl.trainer_resources:
        return Reserved([])
    from megatron_rl.runtime.cluster import ray_cluster
    from parallel.worker_group import start_ray

    start_ray()
    cluster = ray_cluster()
    groups = [g for g in bundle_groups(cfg, cluster) if g.role == "trainer" or pl.servers == "ray"]
    place(groups, cluster, pl.layout)
    return Reserved([g for g in groups if not (pl.layout == "colocated" and g.role == "inference")])
