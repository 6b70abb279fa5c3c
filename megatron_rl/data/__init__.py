"""Prompt datasets: files (parquet/JSONL), validation, generation per env, length filter, resumable sampling."""

from megatron_rl.data.io import read_records, write_records
from megatron_rl.data.length_filter import FilterReport, filter_by_prompt_length
from megatron_rl.data.loader import load_prompts
from megatron_rl.data.sampler import PromptSampler
from megatron_rl.data.write import demonstrations, write_dataset

__all__ = ["FilterReport", "PromptSampler", "demonstrations", "filter_by_prompt_length", "load_prompts",
           "read_records", "write_dataset", "write_records"]
