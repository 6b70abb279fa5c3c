"""Rows for the ``remote`` env from an env server's tasks (``megatron-rl write-rows``).

The server's tools are rendered into the system prompt by the tokenizer's own chat template, so the
generator samples from exactly the text a local env with those tools would give; a template that renders
tools anywhere but the system turn is refused. Rows over the prompt-length limit, counted as the generator
renders them, are dropped and counted.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from megatron_rl.data.io import write_records
from megatron_rl.data.splits import EVAL_SPLITS

_PROBE = "\x00probe\x00"


def _render(tokenizer, messages: list[dict], tools=None) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)


def system_with_tools(tokenizer, prompt: list[dict], tools: list[dict]) -> list[dict]:
    """``prompt`` with the tools rendered into its system turn's content; ValueError where the template puts
    tools outside the system turn (the rewritten prompt must render exactly as the original with tools)."""
    if not tools:
        return prompt
    rest = prompt[1:] if prompt and prompt[0]["role"] == "system" else prompt
    probe = tokenizer.apply_chat_template([{"role": "system", "content": _PROBE}], tokenize=False)
    pre, _, post = probe.partition(_PROBE)
    full = _render(tokenizer, prompt, tools)
    end = full.find(post, len(pre)) if full.startswith(pre) and post else -1
    if end < 0:
        raise ValueError("tokenizer chat template: renders tools outside the system turn; write-rows needs them inside it")
    content = full[len(pre):end]
    rewritten = [{"role": "system", "content": content}, *rest]
    if _render(tokenizer, rewritten) != _render(tokenizer, prompt, tools):
        raise ValueError("tokenizer chat template: renders tools outside the system turn (the conversation after the "
                         "system turn changes with tools); write-rows needs them inside it")
    return rewritten


def remote_row(task: dict, url: str, token_env: str | None, tools: list[dict], tokenizer) -> dict:
    """A ``remote`` row playing ``task`` (a project-format row) on the server at ``url``."""
    extras = task["env_extras"] if isinstance(task["env_extras"], dict) else json.loads(task["env_extras"])
    env_extras = {"url": url, "env_class": task["env_class"], "env_extras": extras,
                  "tools": [t["function"]["name"] for t in tools]}
    if token_env:
        env_extras["token_env"] = token_env
    row = {"prompt": system_with_tools(tokenizer, task["prompt"], tools), "env_class": "remote",
           "env_extras": env_extras, "split": task.get("split", "train")}
    if task.get("instance_id"):
        row["instance_id"] = task["instance_id"]
    return row


def _get(url: str, path: str, token: str | None):
    request = urllib.request.Request(url.rstrip("/") + path,
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def write_rows(url: str, out_dir: str | Path, tokenizer, token_env: str | None, max_prompt_length: int,
               suffix: str = ".parquet") -> dict[str, int]:
    """Write ``train`` and ``eval`` row files from the server's tasks; returns counts (written per file, dropped)."""
    from megatron_rl.env_vars import secret
    from megatron_rl.generator.chat import ChatRenderer

    token = secret(token_env) if token_env else None
    if token_env and token is None:
        raise ValueError(f"--token-env {token_env}: that environment variable is not set")
    envs, tasks = _get(url, "/envs", token), _get(url, "/tasks", token)
    renderer = ChatRenderer(tokenizer)
    files: dict[str, list[dict]] = {"train": [], "eval": []}
    dropped = 0
    for task in tasks:
        if task["env_class"] not in envs:
            raise ValueError(f"server task {task.get('instance_id')}: env_class '{task['env_class']}' is not served")
        row = remote_row(task, url, token_env, envs[task["env_class"]]["tools"], tokenizer)
        if len(renderer.prompt_ids(row["prompt"])) > max_prompt_length:
            dropped += 1
            continue
        files["eval" if row["split"] in EVAL_SPLITS else "train"].append(row)
    counts = {"dropped_too_long": dropped}
    for name, rows in files.items():
        if rows:
            write_records(rows, Path(out_dir) / f"{name}{suffix}")
        counts[name] = len(rows)
    return counts
