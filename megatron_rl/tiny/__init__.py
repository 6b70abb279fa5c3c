"""Tiny-model kit: random-initialised HF checkpoints and an offline-trained tokenizer."""

from megatron_rl.tiny.models import ARCHS, SIZES, make_tiny_model

__all__ = ["ARCHS", "SIZES", "make_tiny_model"]
