"""Remote rows: tools rendered into the system turn exactly as the template renders them; templates that put
tools elsewhere are refused."""

import pytest
import transformers

from megatron_rl.data.remote_rows import remote_row, system_with_tools
from megatron_rl.envs.gridsim.env import SUBMIT
from megatron_rl.envs.gridsim.tasks import generate_rows
from megatron_rl.generator.chat import ChatRenderer
from megatron_rl.tiny import make_tiny_model

TOOLS_IN_USER_TURN = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.role == 'user' and tools %}\nTools: {{ tools | tojson }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(make_tiny_model("qwen3", size="unit"))


def test_the_rewritten_prompt_tokenizes_as_the_original_with_tools(tokenizer):
    task = generate_rows(1, seed=2)[0]
    row = remote_row(task, "http://h:1", "TOK", [SUBMIT], tokenizer)
    assert ChatRenderer(tokenizer).prompt_ids(row["prompt"]) == ChatRenderer(tokenizer, [SUBMIT]).prompt_ids(task["prompt"])
    assert row["env_extras"] == {"url": "http://h:1", "env_class": "gridsim", "env_extras": task["env_extras"],
                                 "tools": ["submit_schedule"], "token_env": "TOK"}
    assert row["prompt"][1] == task["prompt"][1] and "submit_schedule" in row["prompt"][0]["content"]


def test_a_prompt_without_system_turn_gets_one_holding_the_tools(tokenizer):
    prompt = [{"role": "user", "content": "Plan the day."}]
    rewritten = system_with_tools(tokenizer, prompt, [SUBMIT])
    assert rewritten[0]["role"] == "system" and rewritten[1:] == prompt
    assert ChatRenderer(tokenizer).prompt_ids(rewritten) == ChatRenderer(tokenizer, [SUBMIT]).prompt_ids(prompt)


def test_a_template_rendering_tools_outside_the_system_turn_is_refused():
    tokenizer = transformers.AutoTokenizer.from_pretrained(make_tiny_model("qwen3", size="unit"))
    tokenizer.chat_template = TOOLS_IN_USER_TURN
    with pytest.raises(ValueError, match="renders tools outside the system turn"):
        system_with_tools(tokenizer, generate_rows(1, seed=2)[0]["prompt"], [SUBMIT])
