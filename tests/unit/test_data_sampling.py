"""The prompt-length filter (same rendering as the generator) and the resumable sampler."""

import pytest
import transformers

from megatron_rl.contracts import PromptItem
from megatron_rl.data import PromptSampler, filter_by_prompt_length
from megatron_rl.envs import env_tools
from megatron_rl.generator.chat import ChatRenderer
from megatron_rl.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(make_tiny_model("qwen3", size="unit"))


def _item(i: int, words: int, env: str = "arithmetic") -> PromptItem:
    return PromptItem(f"p{i}", [{"role": "user", "content": " ".join(["seven"] * words)}], env, {"answer": "1"})


def test_filter_counts_with_the_generator_rendering_and_tools(tokenizer):
    items = [_item(0, 2), _item(1, 40), _item(2, 2, "text2sql"), _item(3, 5)]
    lengths = [len(ChatRenderer(tokenizer, env_tools(i.env_class)).prompt_ids(i.prompt)) for i in items]
    assert lengths[2] > lengths[0] + 50  # the tool schema is rendered in the system turn
    limit = lengths[3]
    kept, report = filter_by_prompt_length(items, tokenizer, limit)
    assert [i.instance_id for i in kept] == ["p0", "p3"]
    assert (report.kept, report.dropped, report.dropped_by_env) == (2, 2, {"arithmetic": 1, "text2sql": 1})
    assert report.dropped_ids == ["p1", "p2"] and report.longest_kept == limit
    assert filter_by_prompt_length(items, tokenizer, limit - 1)[1].kept == 1
    with pytest.raises(ValueError, match="data.max_prompt_length"):
        filter_by_prompt_length(items, tokenizer, 0)


def test_sampler_epochs_are_permutations_and_deterministic():
    items = list(range(10))
    a = PromptSampler(items, seed=1)
    first, second = a.next_batch(10), a.next_batch(10)
    assert sorted(first) == items and sorted(second) == items and first != second
    assert a.state_dict() == {"epoch": 1, "index": 10, "seed": 1}
    assert PromptSampler(items, seed=1).next_batch(20) == first + second
    assert PromptSampler(items, seed=2).next_batch(10) != first
    assert PromptSampler(items, shuffle=False).next_batch(12) == items + [0, 1]


def test_sampler_resumes_mid_epoch():
    items = list(range(7))
    full = PromptSampler(items, seed=3)
    expected = full.next_batch(4) + full.next_batch(9)
    a = PromptSampler(items, seed=3)
    head = a.next_batch(4) + a.next_batch(5)  # crosses into epoch 1
    b = PromptSampler(items, seed=3)
    b.load_state_dict(a.state_dict())
    assert head + b.next_batch(4) == expected


def test_sampler_rejects_bad_state_and_empty_data():
    s = PromptSampler([1, 2], seed=0)
    with pytest.raises(ValueError, match="same seed"):
        s.load_state_dict({"epoch": 0, "index": 0, "seed": 1})
    with pytest.raises(ValueError, match="dataset changed"):
        s.load_state_dict({"epoch": 0, "index": 5, "seed": 0})
    with pytest.raises(ValueError, match="no prompts"):
        PromptSampler([])
