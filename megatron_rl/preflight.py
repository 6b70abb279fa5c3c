"""Checks a user's inputs before anything expensive starts (Ray, vLLM, megatron): the model folder, its
tokenizer and architecture, the data rows and the fields their envs need, lengths against the model's
limit, the output folder. Each problem is one ``ValueError`` naming the path or key and the fix.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from megatron_rl.config import TrainConfig

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_WEIGHTS = ("*.safetensors", "*.bin")


def check_model_folder(path: str, key: str = "model.path") -> dict:
    """The folder's ``config.json`` once the folder is an HF checkpoint with weights; ValueError otherwise.
    A hub id is refused at once: runs load local folders only."""
    folder = Path(path)
    if not folder.exists():
        if _HUB_ID.match(path) and not path.startswith("."):
            raise ValueError(f"{key}={path}: no such folder, and runs never download from the Hugging Face hub; "
                             f"if it is a hub id, fetch it first (huggingface-cli download {path} --local-dir DIR) "
                             f"and pass {key}=DIR")
        raise ValueError(f"{key}={path}: no such folder; point it at an HF checkpoint folder "
                         "(config.json, *.safetensors, tokenizer files)")
    if not folder.is_dir():
        raise ValueError(f"{key}={path}: is a file; point it at the checkpoint's folder")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{key}={path}: no config.json, so not an HF checkpoint folder; give the folder "
                         "save_pretrained wrote (config.json, *.safetensors, tokenizer files)")
    if not any(next(folder.glob(pattern), None) for pattern in _WEIGHTS):
        raise ValueError(f"{key}={path}: no *.safetensors or *.bin weights in the folder; copy the checkpoint's "
                         "weight files next to its config.json")
    try:
        return json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{key}={path}: config.json is not valid JSON ({err}); re-save the checkpoint") from None


def _load_tokenizer(folder: Path) -> None:
    """Parse the fast tokenizer directly when there is one (a second, not transformers' ten), else load it."""
    if not (folder / "tokenizer.json").is_file():
        import transformers

        transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return
    import tokenizers

    tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    if (folder / "tokenizer_config.json").is_file():
        json.loads((folder / "tokenizer_config.json").read_text())


def check_tokenizer(path: str, key: str = "model.path") -> None:
    """The folder's tokenizer loads from local files (no download)."""
    try:
        _load_tokenizer(Path(path))
    except Exception as err:  # transformers raises many kinds here; all mean the same to the user
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"{key}={path}: its tokenizer does not load ({type(err).__name__}: {first}); copy the "
                         "checkpoint's tokenizer files (tokenizer.json, tokenizer_config.json) into the folder") from None


def check_architecture(hf_config: dict, path: str) -> None:
    """The trainer has a Megatron mapping for the checkpoint's architecture (exact HF name)."""
    from parallel.architectures import ARCHITECTURES

    names = hf_config.get("architectures") or []
    if len(names) != 1 or names[0] not in ARCHITECTURES:
        raise ValueError(f"model.path={path}: architecture {names or 'none'} in config.json is not supported for "
                         f"training; use a checkpoint of {', '.join(sorted(ARCHITECTURES))}")


def check_lengths(cfg: TrainConfig, hf_config: dict) -> None:
    """Prompts leave room for a response, and episodes fit the model's positions."""
    budget, prompt = cfg.generator.max_input_length, cfg.data.max_prompt_length
    if prompt >= budget:
        raise ValueError(f"data.max_prompt_length={prompt}: leaves no room for a response within "
                         f"generator.max_input_length={budget}; lower the first or raise the second")
    limit = hf_config.get("max_position_embeddings")
    if limit and budget > limit:
        raise ValueError(f"generator.max_input_length={budget}: exceeds the model's max_position_embeddings={limit}; "
                         f"set generator.max_input_length<={limit}")


def check_data(cfg: TrainConfig) -> None:
    """Every row of the data files parses and carries the fields its env needs (names file, row, field)."""
    from megatron_rl.data.loader import load_rows

    for key, files in (("data.train_files", cfg.data.train_files), ("data.eval_files", cfg.data.eval_files)):
        missing = [f for f in files if not Path(f).exists()]
        if missing:
            raise ValueError(f"{key}: {missing[0]} does not exist; list existing .jsonl or .parquet files")
        if files:
            load_rows(files)


def check_output_dir(path: str) -> None:
    """The run folder's parent can be created and written."""
    folder = Path(path).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"run.output_dir={path}: {existing} is a file; choose a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"run.output_dir={path}: {existing} is not writable; choose a folder you can write")


def check_train(cfg: TrainConfig) -> None:
    """Everything ``train`` reads, before it starts anything."""
    check_output_dir(cfg.run.output_dir)
    check_data(cfg)
    if cfg.model.path:
        hf_config = check_model_folder(cfg.model.path)
        check_architecture(hf_config, cfg.model.path)
        check_tokenizer(cfg.model.path)
        check_lengths(cfg, hf_config)
    else:
        check_lengths(cfg, {})


def check_serve(cfg: TrainConfig) -> None:
    """What ``serve`` reads before it starts servers: the model folder and its tokenizer."""
    if cfg.model.path and not cfg.inference.external:
        check_model_folder(cfg.model.path)
        check_tokenizer(cfg.model.path)
