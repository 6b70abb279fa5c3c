"""Lazy reads of an HF safetensors checkpoint (single file or sharded with an index)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class HFCheckpoint:
    """Tensors of one checkpoint directory by HF name, each read only when asked for."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if (self.path / INDEX).exists():
            self.weight_map = json.loads((self.path / INDEX).read_text())["weight_map"]
        elif (self.path / SINGLE).exists():
            with safe_open(str(self.path / SINGLE), "pt") as f:
                self.weight_map = {k: SINGLE for k in f.keys()}
        else:
            raise ValueError(f"model.path: {self.path} holds no {SINGLE} or {INDEX}")
        self._files: dict[str, object] = {}

    def get(self, name: str) -> torch.Tensor:
        """The tensor ``name``; KeyError naming the checkpoint if it is absent."""
        if name not in self.weight_map:
            raise KeyError(f"{self.path}: checkpoint has no tensor {name!r}")
        file = self.weight_map[name]
        if file not in self._files:
            self._files[file] = safe_open(str(self.path / file), "pt")
        return self._files[file].get_tensor(name)
