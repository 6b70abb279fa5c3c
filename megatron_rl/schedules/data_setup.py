"""The run's prompts: given files, or data the environment generates into the run folder; length-filtered."""

from __future__ import annotations

import logging
from pathlib import Path

from megatron_rl.config.schema import TrainConfig
from megatron_rl.contracts import PromptItem
from megatron_rl.data import filter_by_prompt_length, load_prompts, write_dataset
from megatron_rl.data.loader import load_rows
from megatron_rl.data.splits import split_rows

log = logging.getLogger("megatron_rl")


def _generated(cfg: TrainConfig, root: Path, split: str, n: int, seed: int) -> Path:
    path = root / "data" / f"{cfg.data.generate_env}_{split}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_dataset(cfg.data.generate_env, n, seed, path, split=split, **cfg.data.generate_knobs)
    return path


def prompts(cfg: TrainConfig, root: Path, tokenizer) -> tuple[list[PromptItem], list[PromptItem], dict[str, float]]:
    """Training and evaluation prompts that fit ``data.max_prompt_length``, and what the filter dropped."""
    d = cfg.data
    if d.train_files:  # the user's data: evaluation on their eval files, eval split, or held-out rows
        splits = split_rows(load_rows(d.train_files), load_rows(d.eval_files) if d.eval_files else None,
                            d.eval_holdout, cfg.run.seed)
        train, evals = splits.train, splits.eval
        log.info("data: evaluation on %s", splits.eval_source)
    else:
        train = load_prompts([_generated(cfg, root, "train", d.num_generated_train, cfg.run.seed)])
        eval_files = d.eval_files or [_generated(cfg, root, "test", d.num_generated_eval, cfg.run.seed + 10_000)]
        evals = load_prompts(eval_files)
    train, train_report = filter_by_prompt_length(train, tokenizer, d.max_prompt_length)
    evals, eval_report = filter_by_prompt_length(evals, tokenizer, d.max_prompt_length)
    if not train:
        raise ValueError(f"data.max_prompt_length={d.max_prompt_length}: every training prompt is longer; raise it")
    log.info("data: %d train prompts (%d dropped as too long), %d eval prompts (%d dropped)",
             len(train), train_report.dropped, len(evals), eval_report.dropped)
    metrics = {"data/train_prompts": float(len(train)), "data/train_dropped_too_long": float(train_report.dropped),
               "data/eval_prompts": float(len(evals))}
    return train, evals, metrics
