"""Recipes compose onto the schema; bad keys and values fail before any work, naming the key."""

import pytest

from megatron_rl.config import load_config, to_yaml
from megatron_rl.config.load import recipe_names


@pytest.mark.parametrize("recipe", recipe_names())
def test_every_recipe_composes(recipe):
    cfg = load_config([f"recipe={recipe}"])
    assert cfg.run.name and to_yaml(cfg)


def test_overrides_reach_nested_dataclasses():
    cfg = load_config(["run.seed=7", "algorithm.correction.tis_ratio_type=token", "algorithm.routing_replay.mode=r3",
                       "trainer.recompute.granularity=selective", "trainer.recompute.modules=[core_attn,moe]"])
    assert cfg.trainer.recompute.transformer_config_kwargs() == dict(
        recompute_granularity="selective", recompute_modules=["core_attn", "moe"])
    assert cfg.run.seed == 7
    assert cfg.algorithm.correction.tis_ratio_type == "token"
    assert cfg.algorithm.routing_replay.mode.value == "r3"


@pytest.mark.parametrize(
    "words,needle",
    [
        (["run.sed=3"], "unknown config key 'run.sed'.*run.seed"),
        (["+run.extra=1"], "unknown config key 'run.extra'"),
        (["nothing=1"], "unknown config key 'nothing'"),
        (["run.seed=abc"], "run.seed"),
        (["run.resume=maybe"], "run.resume"),
        (["algorithm.policy_loss_type=ppo"], "algorithm.policy_loss_type.*regular"),
        (["recipe=no_such_recipe"], "recipe=no_such_recipe.*tiny_cpu"),
        (["run.seed"], "expected key=value"),
        (["data.generate_knobs={hours:8}"], r"takes any key.*\+data.generate_knobs.hours=VALUE"),
        (["algorithm.routing_replay.mode=r2", "algorithm.ppo_mini_batch_size=0"], "routing_replay.mode=r2.*one step per batch.*r3"),
        (["algorithm.routing_replay.mode=r2", "data.train_batch_size=4", "algorithm.ppo_mini_batch_size=4"],
         "routing_replay.mode=r2.*ppo_mini_batch_size=4"),
        (["trainer.recompute.granularity=layer"], "trainer.recompute.granularity.*full, selective"),
        (["trainer.recompute.modules=[moe_act]"], "trainer.recompute.modules.*use moe"),
        (["trainer.recompute.num_layers=0"], "trainer.recompute.num_layers"),
        (["sft.stop_at_accuracy=45"], "sft.stop_at_accuracy.*\\[0, 1\\]"),
        (["sft.check_every=0"], "sft.check_every"),
        (["algorithm.filters.dynamic_sampling_type=replace", "algorithm.filters.dynamic_sampling_target_groups=4",
          "schedule.type=fully_async"], "dynamic_sampling_type=replace.*schedule.type=fully_async.*zero_variance_filter"),
        (["algorithm.filters.dynamic_sampling_type=replace", "algorithm.filters.dynamic_sampling_target_groups=4",
          "algorithm.filters.dynamic_sampling_max_rounds=0"], "algorithm.filters.dynamic_sampling_max_rounds"),
    ],
)
def test_bad_input_names_the_key(words, needle):
    with pytest.raises(ValueError, match=needle):
        load_config(words)


@pytest.mark.parametrize("words", [["algorithm.ppo_mini_batch_size=4"], ["algorithm.ppo_epochs=2"]])
def test_r2_is_accepted_where_a_batch_takes_several_optimizer_steps(words):
    cfg = load_config(["recipe=tiny_moe_cpu", "algorithm.routing_replay.mode=r2", "data.train_batch_size=8", *words])
    assert cfg.algorithm.routing_replay.mode.value == "r2"


def test_a_recipe_file_with_an_unknown_key_is_refused(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("defaults:\n  - train_schema\n  - _self_\nrun:\n  nmae: x\n")
    with pytest.raises(ValueError, match="run.nmae"):
        load_config([f"recipe={bad}"])


@pytest.mark.parametrize("words, cuda, expected", [
    (["recipe=tiny_moe_cpu"], False, "hooks"),  # the CPU build has no native capture
    (["recipe=tiny_moe_cpu"], True, "native"),  # R3 on a CUDA machine: vLLM's own capture
    (["recipe=tiny_moe_cpu", "algorithm.routing_replay.mode=none"], True, "hooks"),  # no R3: no capture flag
    (["recipe=tiny_moe_cpu", "inference.server.routed_experts=hooks"], True, "hooks"),  # asked for by name
])
def test_the_fleet_resolves_how_r3_gets_its_routes(words, cuda, expected, monkeypatch, tmp_path):
    from megatron_rl.schedules import job

    monkeypatch.setattr(job, "on_cpu", lambda: not cuda)
    server = job.fleet_config(load_config(words), "/m", tmp_path).server
    assert server.routed_experts == expected


@pytest.mark.parametrize("words, expected", [
    ([], "float32"),  # the trainer's dtype
    (["model.dtype=bfloat16", "trainer.dtype=bfloat16"], "bfloat16"),
    (["inference.server.dtype=bfloat16"], "bfloat16"),  # a sampler in lower precision than its float32 trainer
])
def test_the_servers_sample_in_the_model_dtype_unless_told_otherwise(words, expected, tmp_path):
    from megatron_rl.schedules import job

    assert job.fleet_config(load_config(["recipe=tiny_moe_cpu", *words]), "/m", tmp_path).server.dtype == expected
