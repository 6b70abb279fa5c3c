"""Random-initialised Hugging Face checkpoints of the supported architectures, deterministic by seed.

No model hub is reachable on the machines this project is developed and tested on, so tests and the
tiny recipes build their own models here and load them through the real loading code
(``AutoModelForCausalLM.from_pretrained`` and vLLM).
"""

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from megatron_rl.env_vars import cache_dir
from megatron_rl.tiny.tokenizer import save_tokenizer, train_tokenizer

KIT_VERSION = 2  # bump when the generated files change, so caches are rebuilt
ARCHS = ("qwen2", "qwen3", "qwen3_moe", "llama")


@dataclass(frozen=True)
class TinySize:
    """Shape of a tiny model. head_dim stays >= 32: vLLM's CPU attention backend needs it."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    num_experts: int
    moe_intermediate_size: int
    vocab_size: int


SIZES = {
    # ~1M parameters: unit and integration tests.
    "unit": TinySize(128, 2, 4, 2, 256, 4, 128, 2048),
    # ~10M: the tiny CPU recipes (fast enough to learn on 2 cores).
    "small": TinySize(256, 4, 8, 2, 768, 4, 256, 4096),
    # ~50M: benchmarks.
    "bench": TinySize(512, 8, 8, 2, 1536, 8, 512, 8192),
    # ~0.53B, Qwen3-shaped (head_dim 128, GQA 12/4): the dense GPU recipe.
    "gpu": TinySize(1536, 20, 12, 4, 4096, 16, 1024, 8192),
    # ~1.3B total, ~0.2B active (16 experts, top-2, 24 layers): the MoE GPU recipe.
    "gpu_moe": TinySize(1024, 24, 8, 4, 3072, 16, 1024, 8192),
}


def _hf_config(arch: str, size: TinySize, vocab_size: int):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=size.hidden_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        intermediate_size=size.intermediate_size,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        eos_token_id=2,  # <|im_end|>, see tokenizer.SPECIAL_TOKENS
        pad_token_id=0,
        bos_token_id=None,
        torch_dtype="float32",
    )
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen3":
        return Qwen3Config(head_dim=size.hidden_size // size.num_heads, **common)
    if arch == "llama":
        return LlamaConfig(head_dim=size.hidden_size // size.num_heads, **common)
    return Qwen3MoeConfig(
        head_dim=size.hidden_size // size.num_heads,
        num_experts=size.num_experts,
        num_experts_per_tok=2,
        moe_intermediate_size=size.moe_intermediate_size,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        **common,
    )


def _spec(arch: str, size: str, seed: int) -> dict:
    if arch not in ARCHS:
        raise ValueError(f"make-tiny-model --arch: unknown architecture {arch!r}; choose one of {ARCHS}")
    if size not in SIZES:
        raise ValueError(f"make-tiny-model --size: unknown size {size!r}; choose one of {tuple(SIZES)}")
    return {"kit_version": KIT_VERSION, "arch": arch, "size": size, "seed": seed, **asdict(SIZES[size])}


def _write(spec: dict, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    size = SIZES[spec["size"]]
    tok = train_tokenizer(vocab_size=size.vocab_size)
    vocab = save_tokenizer(tok, out)
    config = _hf_config(spec["arch"], size, vocab_size=max(vocab, size.vocab_size))
    torch.manual_seed(spec["seed"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "tiny_model.json").write_text(json.dumps(spec, indent=1))


def make_tiny_model(arch: str, out: Path | str | None = None, size: str = "unit", seed: int = 0) -> Path:
    """Write (or reuse) a tiny checkpoint with tokenizer; return its directory.

    Without ``out`` the model goes to the cache (``MEGATRON_RL_CACHE``). A directory holding a model made
    from the same spec is reused as is; the write goes to a temporary folder renamed at the end, so an
    interrupted call never leaves a half-written model behind, and of two processes writing the same spec at
    once (two runs started together) the first rename wins and the second uses it.
    """
    spec = _spec(arch, size, seed)
    out = Path(out) if out else cache_dir() / "tiny" / f"{arch}-{size}-s{seed}-v{KIT_VERSION}"
    if _holds(out, spec):
        return out
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"make-tiny-model --out: {out} exists and holds something else; choose an empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write(spec, tmp)
        if out.exists() and not any(out.iterdir()):
            out.rmdir()
        tmp.rename(out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (isinstance(err, OSError) and _holds(out, spec)):  # else a writer beside us finished first
            raise
    return out


def _holds(folder: Path, spec: dict) -> bool:
    stamp = folder / "tiny_model.json"
    return stamp.exists() and json.loads(stamp.read_text()) == spec
