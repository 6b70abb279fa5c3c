"""The tiny-model kit: deterministic by seed, cached, loadable by transformers, with a chat template."""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from megatron_rl.tiny import ARCHS, make_tiny_model


def weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("arch", ARCHS)
def test_each_architecture_loads_and_runs(arch, tmp_path):
    path = make_tiny_model(arch, tmp_path / arch)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([tok.encode("What is 2 + 3?")])
    assert model(ids).logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 2e6
    if arch == "qwen3_moe":
        assert model.config.num_experts >= 4 and model.config.num_experts_per_tok == 2


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = make_tiny_model("qwen3", tmp_path / "a", seed=1)
    b = make_tiny_model("qwen3", tmp_path / "b", seed=1)
    c = make_tiny_model("qwen3", tmp_path / "c", seed=2)
    wa, wb, wc = weights(a), weights(b), weights(c)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_second_call_reuses_the_cached_model(tmp_path):
    path = make_tiny_model("qwen2", tmp_path / "m")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert make_tiny_model("qwen2", tmp_path / "m") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((path / "tiny_model.json").read_text())["arch"] == "qwen2"


def test_a_writer_beside_us_that_finishes_first_wins_and_we_use_its_model(tmp_path, monkeypatch):
    """Two runs (or two test workers) asking for the same cached model at once: the later rename finds the
    folder full, and the call returns the model the other wrote instead of failing."""
    from megatron_rl.tiny import models

    real_write = models._write

    def write_then_lose_the_race(spec, tmp):
        real_write(spec, tmp)
        monkeypatch.setattr(models, "_write", real_write)
        make_tiny_model("qwen2", tmp_path / "m")  # the other writer, done before our rename

    monkeypatch.setattr(models, "_write", write_then_lose_the_race)
    path = make_tiny_model("qwen2", tmp_path / "m")
    assert json.loads((path / "tiny_model.json").read_text())["arch"] == "qwen2"
    assert [p.name for p in tmp_path.iterdir()] == ["m"], "our temporary folder is removed"


def test_refuses_to_overwrite_another_folder(tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="--out"):
        make_tiny_model("llama", tmp_path / "busy")


def test_chat_template_renders_tools_and_hermes_calls(tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(make_tiny_model("qwen3", tmp_path / "m"))
    tools = [{"type": "function", "function": {"name": "run_sql", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Answer with SQL."},
        {"role": "user", "content": "How many rows?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "run_sql", "arguments": {"query": "SELECT 1"}}}]},
        {"role": "tool", "content": "[[1]]"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nAnswer with SQL.")
    listed = text.split("<tools>\n", 1)[1].split("</tools>", 1)[0]
    assert '"name": "run_sql"' in listed
    assert '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>' in text
    assert "<tool_response>\n[[1]]\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    for special in ("<|im_start|>", "<|im_end|>", "<tool_call>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1


@pytest.mark.parametrize("env_name", ["gridsim", "text2sql"])
def test_a_sampled_tool_call_reaches_the_environment_as_a_call(env_name):
    """The reference reply, as sampled ids decoded by the generator, earns its full reward: the tool-call tags
    survive decoding. Kit version 1 marked them special, decoding dropped them, and no episode of a tool
    recipe was ever rewarded."""
    from megatron_rl.envs.registry import get_env_class
    from megatron_rl.generator.chat import ChatRenderer

    tok = transformers.AutoTokenizer.from_pretrained(make_tiny_model("qwen3"))
    env_class = get_env_class(env_name)
    row = env_class.generate_rows(1, seed=0)[0]
    reply = tok.encode(env_class.reference_reply(row["env_extras"]), add_special_tokens=False) + [tok.eos_token_id]
    env = env_class(row["env_extras"])
    env.init(row["prompt"])
    try:
        step = env.step(ChatRenderer(tok, env_class.tools).decode(reply))
    finally:
        env.close()
    assert step.done and step.reward == 1.0, step
