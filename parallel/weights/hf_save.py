"""Write the trained weights as a Hugging Face checkpoint, one safetensors file per rank.

Each rank writes only the HF tensors it owns (:func:`iter_hf_weights`: TP shards gathered within
their group, pipeline stages and experts kept where they are), so no rank ever holds the whole
model. Rank 0 merges the ranks' weight maps into ``model.safetensors.index.json`` and copies the
source checkpoint's config, generation config and tokenizer files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import save_file

from parallel.weights.hf_export import iter_hf_weights
from parallel.weights.hf_files import INDEX

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _file_names(has_tensors: bool) -> str | None:
    """This rank's shard file name, numbered over the ranks that own tensors."""
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, has_tensors)
    owners = [r for r, f in enumerate(flags) if f]
    if not has_tensors:
        return None
    return f"model-{owners.index(dist.get_rank()) + 1:05d}-of-{len(owners):05d}.safetensors"


def _copy_side_files(source: Path, out: Path) -> None:
    """Config, generation config, tokenizer and template files: everything but weights."""
    for f in source.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name != INDEX:
            shutil.copy2(f, out / f.name)


def _write_index(out: Path, maps: list[dict[str, tuple[str, int]]]) -> None:
    weight_map, total = {}, 0
    for rank_map in maps:
        for name, (file, nbytes) in rank_map.items():
            if name in weight_map:
                raise RuntimeError(f"HF export: tensor {name} was written by two ranks")
            weight_map[name] = file
            total += nbytes
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX).write_text(json.dumps(index, indent=2))


def save_hf_checkpoint(model, pg_collection, out_dir: str | Path, source_dir: str | Path) -> Path:
    """Write ``out_dir`` as an HF checkpoint loadable by ``from_pretrained`` (collective: all ranks)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in iter_hf_weights(model, pg_collection)}
    file = _file_names(bool(tensors))
    if file is not None:
        save_file(tensors, str(out / file), metadata={"format": "pt"})
    rank_map = {name: (file, t.numel() * t.element_size()) for name, t in tensors.items()}
    maps = [None] * dist.get_world_size()
    dist.all_gather_object(maps, rank_map)
    if dist.get_rank() == 0:
        _write_index(out, maps)
        _copy_side_files(Path(source_dir), out)
    dist.barrier()
    return out
