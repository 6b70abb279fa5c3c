"""Placement before anything starts: strategies, layouts, the fit check's messages, the memory arithmetic, and
``megatron-rl plan`` on the real-model recipes."""

import pytest

from megatron_rl.cli import main
from megatron_rl.runtime.cluster import Cluster, Node, parse_cluster
from megatron_rl.runtime.memory import trainer_static_bytes
from megatron_rl.runtime.placement import BundleGroup, PlacementError, place
from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TensorSpec


def trainer(n, strategy="PACK", **kw):
    return BundleGroup("trainer", n, 1, 0, strategy, sized_by="trainer.num_ranks", **kw)


def engines(n, gpus, strategy="SPREAD", **kw):
    return BundleGroup("inference", n, gpus, 0, strategy, sized_by="inference.num_servers", **kw)


def test_cluster_from_the_command_line():
    cluster = parse_cluster("4x8xH100@200")
    assert [n.gpus for n in cluster.nodes] == [8] * 4 and cluster.network_bytes_s == 25e9
    assert cluster.gpu_bytes == 80e9
    with pytest.raises(ValueError, match="NODESxGPUSxKIND"):
        parse_cluster("4 nodes")


def test_pack_fills_a_node_before_the_next_and_engines_spread_over_what_is_left():
    placement = place([trainer(12), engines(2, 2)], parse_cluster("3x8xH100"))
    assert placement.nodes["trainer"] == ["node0"] * 8 + ["node1"] * 4
    assert placement.nodes["inference"] == ["node2", "node1"]  # spread: a fresh node first, then the emptiest


def test_strict_spread_puts_each_bundle_on_its_own_node():
    placement = place([trainer(3, "STRICT_SPREAD")], parse_cluster("3x8xH100"))
    assert placement.nodes["trainer"] == ["node0", "node1", "node2"]
    with pytest.raises(PlacementError, match="fits no node"):
        place([trainer(4, "STRICT_SPREAD")], parse_cluster("3x8xH100"))


def test_missing_gpus_are_counted_before_anything_starts():
    with pytest.raises(PlacementError, match=r"trainer needs 17 GPUs .*trainer.num_ranks.* 1 GPUs missing"):
        place([trainer(17)], parse_cluster("2x8xH100"))
    with pytest.raises(PlacementError, match=r"inference needs 8 GPUs .* 4 GPUs missing"):
        place([trainer(12), engines(4, 2)], parse_cluster("2x8xH100"))


def test_a_bundle_larger_than_any_node_is_named():
    with pytest.raises(PlacementError, match="one inference bundle needs 16 GPUs on one node.*largest eligible node has 8"):
        place([trainer(8), engines(1, 16)], parse_cluster("4x8xH100"))


def test_strict_pack_needs_one_node_with_room_for_all():
    with pytest.raises(PlacementError, match="STRICT_PACK puts all 10 trainer bundles"):
        place([trainer(10, "STRICT_PACK")], parse_cluster("2x8xH100"))


def test_labels_choose_the_nodes_and_a_label_nobody_carries_is_named():
    cluster = Cluster((Node("a", 0, labels={"host_a": 2}), Node("b", 0, labels={"host_b": 1})), "CPU")
    cpu = dict(gpus=0, cpus=0)
    placement = place([BundleGroup("trainer", 2, labels={"host_a": 1}, **cpu),
                       BundleGroup("inference", 1, labels={"host_b": 1}, **cpu)], cluster)
    assert placement.nodes == {"trainer": ["a", "a"], "inference": ["b"]}
    with pytest.raises(PlacementError, match=r"no node carries \{'host_c': 1\}"):
        place([BundleGroup("inference", 1, labels={"host_c": 1}, **cpu)], cluster)
    with pytest.raises(PlacementError, match="fits no node"):  # host_a carries room for two ranks, not three
        place([BundleGroup("trainer", 3, labels={"host_a": 1}, **cpu)], cluster)


def test_colocated_engines_sit_on_their_trainer_ranks_gpus():
    placement = place([trainer(16), engines(4, 4)], parse_cluster("2x8xH100"), layout="colocated")
    assert placement.nodes["inference"] == ["node0", "node0", "node1", "node1"]
    with pytest.raises(PlacementError, match="engine 0 would span trainer ranks on nodes"):
        place([trainer(8, "SPREAD"), engines(2, 4)], parse_cluster("2x8xH100"), layout="colocated")


def test_static_memory_by_hand():
    # one TP-split matrix (8 x 4 = 32 elements, 16 per TP rank) and one replicated norm (4), fp32, TP=2:
    # weights (16 + 4) x 4 B = 80, fp32 gradients 80, Adam moments 2 x 4 B x 20 = 160 (no master copy for fp32)
    specs = [TensorSpec("model.layers.0.mlp.up_proj.weight", (8, 4), "float32"),
             TensorSpec("model.layers.0.input_layernorm.weight", (4,), "float32")]
    layout = TrainerLayout(num_layers=1, tp=2)
    assert trainer_static_bytes(specs, layout, "float32") == {"weights": 80, "grads": 80, "optimizer": 160}
    # bf16 with DP=2: weights 2 B x 20, gradients still fp32, moments + fp32 master 12 B x 20 / 2 data-parallel ranks
    bf16 = [TensorSpec(s.name, s.shape, "bfloat16") for s in specs]
    layout = TrainerLayout(num_layers=1, tp=2, dp=2)
    assert trainer_static_bytes(bf16, layout, "bfloat16") == {"weights": 40, "grads": 80, "optimizer": 120}


@pytest.mark.parametrize(("recipe", "cluster", "fragment"), [
    ("qwen3_8b", "2x8xH100@400", "inference  4 bundle(s) x 2 GPU  node1: #0-3"),
    ("qwen3_30b_a3b", "3x8xH100@400", "trainer    16 bundle(s) x 1 GPU  node0: #0-7, node1: #8-15"),
    ("qwen3_235b_a22b", "12x8xH200@400", "inference  4 bundle(s) x 8 GPU  node8: #0, node9: #1"),
])
def test_plan_prints_placement_memory_and_transfer_for_the_real_model_recipes(recipe, cluster, fragment, capsys):
    assert main(["plan", f"recipe={recipe}", f"cluster={cluster}"]) == 0
    out = capsys.readouterr().out
    assert fragment in out
    assert "(fits)" in out and "DOES NOT FIT" not in out
    assert "engine memory per GPU" in out and "projected:" in out


def test_plan_fails_early_naming_what_is_missing(capsys):
    assert main(["plan", "recipe=qwen3_235b_a22b", "cluster=8x8xH200"]) == 2
    assert "inference needs 32 GPUs" in capsys.readouterr().err


def test_plan_folds_experts_by_expert_tensor_parallel(capsys):
    """ETP=2 under TP=1: attention whole on every rank, each routed expert split over 2 ranks, so the busiest
    rank holds about half the expert weights of ETP=1 (the default, ETP = TP)."""
    base = ["plan", "recipe=qwen3_30b_a3b", "cluster=3x8xH100@400"]
    weights = {}
    for etp in (1, 2):
        assert main([*base, f"trainer.parallel.expert_tensor_parallel_size={etp}"]) == 0
        out = capsys.readouterr().out
        assert f"TP=1 PP=1 EP=8 DP=16 ETP={etp};" in out
        weights[etp] = float(out.split("(busiest rank): weights ")[1].split(" GB")[0])
    assert weights[1] > 1.5 * weights[2], weights


def test_tensor_parallel_moe_training_is_refused_naming_the_field(capsys):
    """megatron-core's MoE layer trains under TP only with sequence parallelism, which is not enabled."""
    assert main(["plan", "recipe=qwen3_30b_a3b", "cluster=3x8xH100@400",
                 "trainer.parallel.tensor_model_parallel_size=2"]) == 2
    err = capsys.readouterr().err
    assert "trainer.parallel.tensor_model_parallel_size: 2 on a MoE model" in err and "sequence parallelism" in err
