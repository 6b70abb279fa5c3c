"""Transfer plan and buckets: placement on PP/EP/TP ranks, shards, bucket packing, fingerprints, staleness."""

from __future__ import annotations


import pytest
import torch

from weight_transfer.buckets import ALIGN, pack, unpack
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TensorSpec, TransferPlan, natural_key
from weight_transfer.projection import Fleet, Links, project


def moe_specs(layers=4, experts=4, hidden=8, inter=16) -> list[TensorSpec]:
    specs = [TensorSpec("model.embed_tokens.weight", (32, hidden), "bfloat16"),
             TensorSpec("model.norm.weight", (hidden,), "float32"),
             TensorSpec("lm_head.weight", (32, hidden), "bfloat16")]
    for i in range(layers):
        p = f"model.layers.{i}"
        specs += [TensorSpec(f"{p}.self_attn.q_proj.weight", (hidden, hidden), "bfloat16"),
                  TensorSpec(f"{p}.self_attn.o_proj.weight", (hidden, hidden), "bfloat16"),
                  TensorSpec(f"{p}.mlp.gate.weight", (experts, hidden), "float32")]
        specs += [TensorSpec(f"{p}.mlp.experts.{e}.down_proj.weight", (hidden, inter), "bfloat16") for e in range(experts)]
    return specs


def test_each_stage_and_expert_rank_sends_its_own_tensors():
    layout = TrainerLayout(num_layers=4, tp=2, pp=2, dp=2, ep=2, num_experts=4)
    plan = TransferPlan.build(moe_specs(), layout, bucket_bytes=1 << 20, senders="spread")
    by_name = {e.spec.name: e for e in plan.entries}
    # rank = tp + 2 * (dp + 2 * pp): stage 1 starts at rank 4, expert rank 1 adds 2
    assert by_name["model.embed_tokens.weight"].sender in (0, 1)
    assert by_name["lm_head.weight"].sender in (4, 5)
    assert by_name["model.layers.1.mlp.experts.3.down_proj.weight"].sender in (2, 3)
    assert by_name["model.layers.3.mlp.experts.0.down_proj.weight"].sender in (4, 5)
    assert by_name["model.layers.3.mlp.experts.2.down_proj.weight"].sender in (6, 7)
    assert plan.senders == list(range(8)), "both TP ranks of every group send, no rank gathers the model"
    for bucket in plan.buckets:
        assert {by_name[s.name].sender for s in bucket.slots} == {bucket.sender}


def test_owner_rule_sends_from_the_rank_that_exports_each_tensor():
    # parallel.weights.hf_export yields a tensor on TP rank 0 and data-parallel rank 0 of its group only
    layout = TrainerLayout(num_layers=4, tp=2, pp=2, dp=2, ep=2, num_experts=4)
    plan = TransferPlan.build(moe_specs(), layout, bucket_bytes=1 << 20)
    by_name = {e.spec.name: e.sender for e in plan.entries}
    assert by_name["model.embed_tokens.weight"] == 0 and by_name["lm_head.weight"] == 4
    assert by_name["model.layers.1.self_attn.q_proj.weight"] == 0, "dense tensors: dp rank 0 of stage 0"
    assert by_name["model.layers.1.mlp.experts.3.down_proj.weight"] == 2, "expert rank 1 is dp rank 1"
    assert by_name["model.layers.3.mlp.experts.2.down_proj.weight"] == 6
    assert plan.senders == [0, 2, 4, 6], "TP rank 1 of every group only takes part in the gather"
    with pytest.raises(ValueError, match="senders='tp1'"):
        TransferPlan.build(moe_specs(), layout, 1 << 20, senders="tp1")


def test_expert_tensor_parallel_groups_differ_from_attentions():
    """Megatron folds a stage's ranks twice: attention by (TP, DP), routed experts by (ETP, EP, expert DP).
    TP=1 x DP=4 with ETP=2 x EP=2: attention whole on rank 0, expert rank 1's matrices split over ranks 2-3."""
    layout = TrainerLayout(num_layers=4, tp=1, dp=4, ep=2, num_experts=4, etp=2)
    plan = TransferPlan.build(moe_specs(), layout, 1 << 20)
    by_name = {e.spec.name: e for e in plan.entries}
    assert [(s.rank, s.dim) for s in by_name["model.layers.0.self_attn.o_proj.weight"].shards] == [(0, None)]
    expert = by_name["model.layers.0.mlp.experts.3.down_proj.weight"]
    assert [(s.rank, s.dim, s.start, s.stop) for s in expert.shards] == [(2, 1, 0, 8), (3, 1, 8, 16)]
    assert expert.sender == 2 and plan.senders == [0, 2], "expert-TP rank 0 of each expert rank exports"
    # TP=2 x DP=2 with ETP=1 x EP=4: every rank holds a quarter of the experts whole
    layout = TrainerLayout(num_layers=4, tp=2, dp=2, ep=4, num_experts=4, etp=1)
    by_name = {e.spec.name: e for e in TransferPlan.build(moe_specs(), layout, 1 << 20).entries}
    assert [e for e in range(4) if by_name[f"model.layers.0.mlp.experts.{e}.down_proj.weight"].sender == 3] == [3]
    assert len(by_name["model.layers.0.mlp.experts.3.down_proj.weight"].shards) == 1
    assert [s.rank for s in by_name["model.layers.0.self_attn.o_proj.weight"].shards] == [0, 1]
    assert TransferPlan.from_json(TransferPlan.build(moe_specs(), layout, 1 << 20).to_json()).layout == layout
    with pytest.raises(ValueError, match="etp x ep = 4 x 2 must divide the 4 ranks"):
        TrainerLayout(num_layers=4, tp=2, dp=2, ep=2, num_experts=4, etp=4)


def test_plan_of_deepseek_v3_size_survives_a_json_round_trip():
    """The plan of a PP16 x EP16 DeepSeek-V3 layout (46848 expert tensors) builds and travels as JSON unchanged.
    How long that takes is benchmarks/bench_weight_transfer.py's to print (its DeepSeek-V3 projection row)."""
    specs = [TensorSpec(f"model.layers.{i}.mlp.experts.{e}.{p}.weight", (2048, 7168), "bfloat16")
             for i in range(61) for e in range(256) for p in ("gate_proj", "up_proj", "down_proj")]
    layout = TrainerLayout(num_layers=61, pp=16, dp=16, ep=16, num_experts=256)
    plan = TransferPlan.build(specs, layout, 512 << 20)
    again = TransferPlan.from_json(plan.to_json())
    assert again.fingerprint == plan.fingerprint and len(plan.entries) == 46848
    assert again.entries == plan.entries and len(again.buckets) == len(plan.buckets)


def test_shards_follow_tensor_parallel_splits():
    layout = TrainerLayout(num_layers=4, tp=2)
    by_name = {e.spec.name: e for e in TransferPlan.build(moe_specs(), layout, 1 << 20).entries}
    q = by_name["model.layers.0.self_attn.q_proj.weight"].shards
    assert [(s.rank, s.dim, s.start, s.stop) for s in q] == [(0, 0, 0, 4), (1, 0, 4, 8)]
    o = by_name["model.layers.0.self_attn.o_proj.weight"].shards
    assert [(s.rank, s.dim, s.start, s.stop) for s in o] == [(0, 1, 0, 4), (1, 1, 4, 8)]
    assert [(s.rank, s.dim) for s in by_name["model.norm.weight"].shards] == [(0, None)]


def test_buckets_respect_size_alignment_and_global_order():
    layout = TrainerLayout(num_layers=4, tp=2)
    plan = TransferPlan.build(moe_specs(), layout, bucket_bytes=1024, senders="spread")
    assert [b.index for b in plan.buckets] == list(range(len(plan.buckets)))
    for b in plan.buckets:
        assert b.nbytes % ALIGN == 0 and all(s.offset % ALIGN == 0 for s in b.slots)
        assert b.nbytes <= 1024 or len(b.slots) == 1, "only a tensor larger than a bucket travels alone"
    assert [b.sender for b in plan.buckets[:2]] == [0, 1], "senders interleave so they all start at once"
    names = [s.name for b in plan.buckets for s in b.slots]
    assert sorted(names) == sorted(s.name for s in moe_specs())


def test_pack_unpack_round_trip_mixed_dtypes():
    plan = TransferPlan.build(moe_specs(layers=1), TrainerLayout(num_layers=1), bucket_bytes=1 << 20)
    gen = torch.Generator().manual_seed(0)
    tensors = {e.spec.name: torch.randn(e.spec.shape, generator=gen).to(getattr(torch, e.spec.dtype))
               for e in plan.entries}
    (bucket,) = plan.buckets
    flat = pack(bucket, tensors, torch.full((bucket.nbytes,), 255, dtype=torch.uint8))
    for name, view in unpack(bucket, flat):
        assert view.dtype == tensors[name].dtype and torch.equal(view, tensors[name])


def test_pack_refuses_tensor_that_does_not_match_the_plan():
    plan = TransferPlan.build(moe_specs(layers=1), TrainerLayout(num_layers=1), bucket_bytes=1 << 20)
    tensors = {e.spec.name: torch.zeros(e.spec.shape, dtype=getattr(torch, e.spec.dtype)) for e in plan.entries}
    tensors["model.norm.weight"] = torch.zeros(9)
    with pytest.raises(ValueError, match="model.norm.weight.*rebuild the plan"):
        pack(plan.buckets[0], tensors, torch.empty(plan.buckets[0].nbytes, dtype=torch.uint8))


def test_plan_round_trips_through_json_and_fingerprint_tracks_layout():
    specs = moe_specs()
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=4, tp=2), 4096)
    again = TransferPlan.from_json(plan.to_json())
    assert again.fingerprint == plan.fingerprint and again.buckets == plan.buckets
    assert TransferPlan.build(specs, TrainerLayout(num_layers=4, tp=1), 4096).fingerprint != plan.fingerprint
    assert TransferPlan.build(specs, TrainerLayout(num_layers=4, tp=2), 256).fingerprint != plan.fingerprint
    text = plan.format()
    assert plan.fingerprint in text and "r0[dim0 0:4] + r1[dim0 4:8]" in text


def test_duplicate_names_and_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="duplicate"):
        TransferPlan.build(moe_specs()[:1] * 2, TrainerLayout(num_layers=4), 1024)
    with pytest.raises(ValueError, match="weight_transfer.layout.pp"):
        TrainerLayout(num_layers=3, pp=4)
    with pytest.raises(ValueError, match="weight_transfer.layout.ep"):
        TrainerLayout(num_layers=2, dp=2, ep=2, num_experts=3)


def test_natural_order_puts_layer_2_before_layer_10():
    assert sorted(["layers.10.w", "layers.2.w"], key=natural_key) == ["layers.2.w", "layers.10.w"]


def test_projection_by_hand_and_fleet_size_check():
    specs = [TensorSpec(f"model.layers.0.mlp.experts.{e}.up_proj.weight", (250_000,), "float32") for e in range(2)]
    plan = TransferPlan.build(specs, TrainerLayout(num_layers=1, dp=2, ep=2, num_experts=2), 1 << 20)
    assert plan.senders == [0, 1] and plan.nbytes == 2_000_000
    links = Links(inter_node_gbps=1.0, intra_node_gbps=2.0)
    p = project(plan, Fleet(trainer_nodes=2, inference_nodes=1, gpus_per_node=1, inference_tp=1), links)
    # each trainer node sends 1 MB (1 ms at 1 GB/s); the inference node takes in 2 MB (2 ms), fans out at 2 GB/s (1 ms)
    assert p["sender_node_egress_s"] == pytest.approx(1e-3) and p["broadcast_s"] == pytest.approx(2e-3)
    p = project(plan, Fleet(trainer_nodes=1, inference_nodes=1, gpus_per_node=2, inference_tp=1), links)
    # one trainer node sends both; two single-GPU replicas on the inference node each take the whole model
    assert p["sender_node_egress_s"] == pytest.approx(2e-3) and p["sharded_s"] == pytest.approx(4e-3)
    with pytest.raises(ValueError, match="2 trainer ranks.*4 nodes x 1 GPUs"):
        project(plan, Fleet(trainer_nodes=4, inference_nodes=1, gpus_per_node=1), links)
