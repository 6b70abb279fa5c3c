"""Generate an env's dataset into a parquet or JSONL file (no download needed)."""

from __future__ import annotations

from pathlib import Path

from megatron_rl.data.io import write_records


def write_dataset(env: str, n: int, seed: int, path: str | Path, split: str = "train", **knobs) -> Path:
    """Write ``n`` rows of env ``env`` drawn with ``seed``; ``knobs`` go to its generator (e.g. ``digits=2``)."""
    from megatron_rl.envs import get_env_class

    if n < 1:
        raise ValueError(f"write_dataset: n must be >= 1, got {n}")
    return write_records(get_env_class(env).generate_rows(n, seed, split, **knobs), path)


def demonstrations(items: list) -> list[list[dict]]:
    """SFT conversations: each item's prompt followed by its env's reference reply as the assistant turn."""
    from megatron_rl.envs import get_env_class

    return [item.prompt + [{"role": "assistant", "content": get_env_class(item.env_class).reference_reply(item.env_extras)}]
            for item in items]
