"""Generator against a real vLLM CPU server: multi-turn token-in-token-out, per-turn rewards, failures."""

import asyncio

import pytest
import transformers

from megatron_rl.contracts import FAILED, GeneratorInput, PromptItem, TrainingBatch
from megatron_rl.envs.base import Env, EnvError, StepResult
from megatron_rl.envs.registry import register_env
from megatron_rl.generator.chat import ChatRenderer
from megatron_rl.generator.config import GeneratorConfig
from megatron_rl.generator.episode import EpisodeState
from megatron_rl.generator.generator import Generator
from megatron_rl.inference.config import InferenceConfig, ServerConfig
from megatron_rl.inference.fleet import InferenceFleet
from megatron_rl.inference.launcher import LocalServers
from megatron_rl.inference.types import GenerationResult
from megatron_rl.tiny import make_tiny_model

OBSERVATION = "clock says 12:34"


@register_env
class TwoTurnEnv(Env):
    """Answers the first turn with a tool observation (reward 0.25), ends on the second (reward 1)."""

    name = "test_two_turn"

    def __init__(self, extras, config=None):
        super().__init__(extras, config)
        self.turn = 0

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return StepResult([{"role": "tool", "content": OBSERVATION}], 0.25, False)
        return StepResult([], 1.0, True)


_first_try = set()


@register_env
class FlakyEnv(Env):
    """``always`` rows fail every time; other rows fail once (their first episode), then work."""

    name = "test_flaky"

    def init(self, prompt):
        key = self.extras["key"]
        if self.extras.get("always") or key not in _first_try:
            _first_try.add(key)
            raise EnvError("simulated sandbox crash")
        return prompt, {}

    def step(self, action):
        return StepResult([], 1.0, True)


@pytest.fixture(scope="module")
def model():
    return make_tiny_model("qwen3", size="unit")


@pytest.fixture(scope="module")
def fleet_config(model, tmp_path_factory):
    server = ServerConfig(model_path=str(model), max_model_len=512, kv_cache_gib=0.25,
                          run_dir=str(tmp_path_factory.mktemp("servers")))
    with LocalServers(server, num=1) as local:
        yield InferenceConfig(num_servers=0, external_server_urls=local.urls)


def run(fleet_config, model, gi, **cfg):
    tok = transformers.AutoTokenizer.from_pretrained(model)

    async def go():
        async with InferenceFleet(fleet_config) as fleet:
            gen = Generator(fleet, tok, GeneratorConfig(**cfg), vocab_size=len(tok), show_progress=False)
            return await gen.generate(gi)

    return tok, asyncio.run(go())


def prompt(instance, env, **extras):
    return PromptItem(instance, [{"role": "user", "content": "What time is it?"}], env, extras)


def test_multi_turn_ids_are_sampled_ids_plus_observation_ids(fleet_config, model):
    gi = GeneratorInput([prompt("clock", "test_two_turn")], n_samples_per_prompt=2, step=3, policy_version=0)
    tok, out = run(fleet_config, model, gi, max_turns=2, max_tokens_per_turn=12, max_input_length=400, n_samples_per_prompt=2)
    renderer = ChatRenderer(tok)
    for t in out.trajectories:
        mask = t.loss_mask
        first = mask.index(0)  # the observation starts where the first action ends
        # a reply cut at max_tokens gets the template's end-of-turn token (mask 0) before the observation
        closing = [] if t.response_ids[first - 1] == renderer.eos_id else [renderer.eos_id]
        obs_ids = closing + renderer.observation_ids([{"role": "tool", "content": OBSERVATION}])
        second = first + len(obs_ids)
        assert t.response_ids[first:second] == obs_ids and mask[first:second] == [0] * len(obs_ids)
        assert all(mask[:first]) and all(mask[second:]) and len(mask) > second
        assert t.rollout_logprobs[first:second] == [0.0] * len(obs_ids)
        if t.stop_reason == "stop":  # per-turn rewards sit on each turn's last token
            assert t.rewards[first - 1] == 0.25 and t.rewards[-1] == 1.0 and sum(t.rewards) == 1.25
        else:  # the last reply was cut at max_tokens: the episode scores zero
            assert t.stop_reason == "length" and not any(t.rewards)
        assert t.group_step == 3 and t.timing["llm"] > 0
    batch = TrainingBatch.from_trajectories(out.trajectories, [[0.0] * len(t.response_ids) for t in out.trajectories],
                                            [0, 0], pad_token_id=0)
    for row, t in enumerate(out.trajectories):
        assert batch.input_ids[row, : t.num_tokens].tolist() == t.prompt_token_ids + t.response_ids
    assert out.metrics["generate/num_turns"] == 2


def test_the_ledger_never_retokenises_text():
    tok = transformers.AutoTokenizer.from_pretrained(make_tiny_model("qwen3", size="unit"))
    # A sampler may emit "1", "2" as two tokens although BPE encodes "12" as one: re-tokenising the
    # decoded text would silently change what the trainer scores.
    sampled = [tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("2")]
    assert tok.encode(tok.decode(sampled), add_special_tokens=False) != sampled
    state = EpisodeState(prompt_ids=[5])
    state.add_action(GenerationResult(sampled, [-0.1, -0.2], "stop", "r", "0"), version=0)
    assert state.response_ids == sampled


def test_failed_environments_are_retried_then_their_group_is_left_out(fleet_config, model):
    gi = GeneratorInput([prompt("ok", "test_flaky", key="ok"), prompt("broken", "test_flaky", key="b", always=True)],
                        n_samples_per_prompt=2, step=0, policy_version=0)
    _, out = run(fleet_config, model, gi, max_tokens_per_turn=8, max_env_attempts=2, n_samples_per_prompt=2)
    by_group = {t.name: t for t in out.trajectories}
    assert all(by_group[f"ok#{r}"].stop_reason != FAILED for r in range(2))
    assert all(by_group[f"broken#{r}"].stop_reason == FAILED for r in range(2))
    assert all(not any(by_group[f"broken#{r}"].loss_mask) for r in range(2))
    assert out.metrics["generate/failed_groups"] == 1
