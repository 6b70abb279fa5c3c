"""Token-in, token-out chat rendering: a prompt is rendered once; later turns are appended as ids.

The conversation is never re-tokenised from text: the sampler's ids are kept as sampled, and each
observation turn is rendered by the tokenizer's own chat template as the text that follows an
assistant turn, tokenised on its own, and appended.
"""

from __future__ import annotations

_PROBE = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class ChatRenderer:
    """Renders prompts and observation turns with one tokenizer's chat template."""

    def __init__(self, tokenizer, tools: list[dict] | None = None):
        if tokenizer.eos_token is None:
            raise ValueError("tokenizer: needs an eos_token that ends an assistant turn")
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.eos_id = tokenizer.eos_token_id

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The prompt as the sampler sees it: template, tools in the system turn, generation prompt."""
        text = self.tokenizer.apply_chat_template(messages, tools=self.tools, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def observation_ids(self, observations: list[dict]) -> list[int]:
        """Ids of the text the template puts after an assistant turn's end for these observation
        messages (role tool or user), up to and including the next assistant generation prompt."""
        base = self.tokenizer.apply_chat_template(_PROBE, tools=self.tools, tokenize=False)
        full = self.tokenizer.apply_chat_template(
            _PROBE + observations, tools=self.tools, add_generation_prompt=True, tokenize=False
        )
        cut = base.rindex(self.tokenizer.eos_token) + len(self.tokenizer.eos_token)
        if full[:cut] != base[:cut]:
            raise ValueError("tokenizer chat template: rendering an extra turn changed the earlier turns")
        return self.tokenizer.encode(full[cut:], add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
