"""Deterministic shuffled epochs over a prompt list with a resumable position (``epoch``, ``index``, ``seed``)."""

from __future__ import annotations

import random


class PromptSampler:
    """Yields items in a fresh seeded permutation each epoch; ``state_dict`` resumes exactly where it stopped."""

    def __init__(self, items: list, seed: int = 0, shuffle: bool = True):
        if not items:
            raise ValueError("PromptSampler: no prompts (check data.train_files and the split)")
        self.items, self.seed, self.shuffle = list(items), seed, shuffle
        self.epoch, self.index = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self, size: int) -> list:
        """The next ``size`` items, continuing into the next epoch when this one runs out."""
        if size < 1:
            raise ValueError(f"PromptSampler.next_batch: size must be >= 1, got {size}")
        batch = []
        while len(batch) < size:
            if self.index == len(self.items):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            batch.append(self.items[self._order[self.index]])
            self.index += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state``; the seed must match the one this sampler was built with."""
        if state["seed"] != self.seed:
            raise ValueError(f"data sampler state: saved seed {state['seed']} differs from data seed {self.seed}; "
                             "resume with the same seed")
        if not 0 <= state["index"] <= len(self.items):
            raise ValueError(f"data sampler state: index {state['index']} outside a dataset of {len(self.items)} rows; "
                             "was the dataset changed since the checkpoint?")
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation(self.epoch)
