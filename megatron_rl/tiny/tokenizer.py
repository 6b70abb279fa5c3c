"""A byte-level BPE tokenizer trained offline, with ChatML special tokens and a hermes tool template."""

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from megatron_rl.tiny.corpus import corpus

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
# The tags are whole tokens (kept out of BPE merges) but not special, as in Qwen3's tokenizer: decoding with
# skip_special_tokens keeps them, so a tool-call parser reading the decoded reply sees <tool_call>. Marked
# special (the kit before version 2), they were dropped from every reply and no tool call was ever found.
TAGS = SPECIAL_TOKENS[3:]

# ChatML; tools are listed in the system turn as JSON function signatures, and the model calls them as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call> (the hermes format). Tool results come back
# in a user turn wrapped in <tool_response>.
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions. Function signatures are inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

To call a function, reply with a JSON object with its name and arguments inside <tool_call></tool_call>.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content if message.content is string else '' }}
{%- if message.tool_calls %}{% for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def train_tokenizer(vocab_size: int = 2048, seed: int = 0) -> Tokenizer:
    """Train byte-level BPE on the generated corpus; the same seed gives the same tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed=seed), trainer=trainer)
    tok.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAGS])  # same ids, not special
    return tok


def save_tokenizer(tok: Tokenizer, out: Path) -> int:
    """Write a transformers-loadable tokenizer (with chat template) to ``out``; return its size."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return len(fast)
