"""Drop prompts longer than a limit, measured exactly as the generator renders them (chat template, env tools)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from megatron_rl.contracts import PromptItem


@dataclass
class FilterReport:
    """What the prompt-length filter kept and dropped."""

    kept: int = 0
    dropped: int = 0
    dropped_by_env: dict[str, int] = field(default_factory=dict)
    longest_kept: int = 0
    dropped_ids: list[str] = field(default_factory=list)


def filter_by_prompt_length(items: list[PromptItem], tokenizer, max_prompt_length: int) -> tuple[list[PromptItem], FilterReport]:
    """Items whose rendered prompt (generation prompt and their env's tools included) has at most
    ``max_prompt_length`` tokens, and a report of what was dropped."""
    from megatron_rl.envs import env_tools
    from megatron_rl.generator.chat import ChatRenderer

    if max_prompt_length < 1:
        raise ValueError(f"data.max_prompt_length: must be >= 1, got {max_prompt_length}")
    renderers: dict[str, ChatRenderer] = {}
    kept, report, dropped = [], FilterReport(), Counter()
    for item in items:
        if item.env_class not in renderers:
            renderers[item.env_class] = ChatRenderer(tokenizer, tools=env_tools(item.env_class))
        length = len(renderers[item.env_class].prompt_ids(item.prompt))
        if length <= max_prompt_length:
            kept.append(item)
            report.longest_kept = max(report.longest_kept, length)
        else:
            dropped[item.env_class] += 1
            report.dropped_ids.append(item.instance_id)
    report.kept, report.dropped, report.dropped_by_env = len(kept), sum(dropped.values()), dict(dropped)
    return kept, report
