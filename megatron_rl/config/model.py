"""Which Hugging Face checkpoint the run trains: a path, or a tiny model built on the spot."""

from dataclasses import dataclass

from megatron_rl.tiny import ARCHS, SIZES


@dataclass
class ModelConfig:
    """``model.*``: the policy checkpoint (HF format: config, safetensors, tokenizer)."""

    path: str = ""
    """HF checkpoint directory; empty builds the tiny model described by ``tiny_*`` below."""
    tiny_arch: str = "qwen3"
    """Architecture of the tiny model built when ``path`` is empty."""
    tiny_size: str = "small"
    """Size of the tiny model built when ``path`` is empty (unit, small, bench; gpu, gpu_moe for the GPU recipes)."""
    tiny_seed: int = 0
    """Initialisation seed of the tiny model."""
    dtype: str = "float32"
    """Parameter dtype for trainer and sampler: float32 or bfloat16."""

    def __post_init__(self) -> None:
        if self.tiny_arch not in ARCHS:
            raise ValueError(f"model.tiny_arch: {self.tiny_arch!r} is not one of {ARCHS}")
        if self.tiny_size not in SIZES:
            raise ValueError(f"model.tiny_size: {self.tiny_size!r} is not one of {tuple(SIZES)}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"model.dtype: {self.dtype!r} is not one of float32, bfloat16")

    def resolve_path(self) -> str:
        """The checkpoint directory, building (or reusing the cached) tiny model if none is given."""
        if self.path:
            return self.path
        from megatron_rl.tiny import make_tiny_model

        return str(make_tiny_model(self.tiny_arch, size=self.tiny_size, seed=self.tiny_seed))
