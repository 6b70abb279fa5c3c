"""Shared pieces of the weight-transfer integration tests: perturbed checkpoints as the trainer's weights,
engines with the receiver mixin, and log-probs on fixed tokens from vLLM and from transformers."""

from __future__ import annotations

import os
import shutil
import zlib
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from weight_transfer.layout import TrainerLayout
from weight_transfer.plan import TransferPlan, specs_from_tensors

TOKENS = [[5, 17, 300, 42, 7, 999, 1234, 64, 88, 2000, 3, 11, 512, 77, 1500, 9],
          [101, 202, 303, 404, 505, 606, 707, 808, 909, 1010, 1111, 1212]]
RECEIVER = "weight_transfer.vllm_receiver.WeightReceiver"


def checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def perturbed(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """The checkpoint plus deterministic noise per tensor (a stand-in for one optimizer step)."""
    out = {}
    for name, tensor in checkpoint(model_dir).items():
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        out[name] = tensor + 0.03 * torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype)
    return out


class PerturbedWeights:
    """``weights_fn`` for LocalSenders: version v yields the checkpoint perturbed with seed v.
    ``die_at=(version, after)`` makes the sender process exit after yielding ``after`` tensors of that version;
    ``delay_s`` slows each tensor; ``started`` is a file created once yielding begins."""

    def __init__(self, model_dir: Path, die_at: tuple[int, int] | None = None, delay_s: float = 0.0,
                 started: str | None = None):
        self.model_dir, self.die_at, self.delay_s, self.started = Path(model_dir), die_at, delay_s, started

    def __call__(self, rank: int, version: int):
        import time

        if self.started:
            Path(self.started).touch()
        for i, pair in enumerate(perturbed(self.model_dir, version).items()):
            if self.die_at and self.die_at == (version, i):
                os._exit(3)
            time.sleep(self.delay_s)
            yield pair


def plan_for(model_dir: Path, tp: int, bucket_bytes: int, senders: str = "spread") -> TransferPlan:
    """``spread``: PerturbedWeights yields every tensor on every rank, so both TP ranks send."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    experts = getattr(config, "num_experts", 0) or 0
    layout = TrainerLayout(num_layers=config.num_hidden_layers, tp=tp, num_experts=experts)
    return TransferPlan.build(specs_from_tensors(checkpoint(model_dir)), layout, bucket_bytes, senders=senders)


def make_llm(model_dir: Path):
    from vllm import LLM

    return LLM(str(model_dir), dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
               kv_cache_memory_bytes=1 << 26, worker_extension_cls=RECEIVER)


def close_llm(llm) -> None:
    """Stop the engine's processes now rather than at interpreter exit."""
    llm.llm_engine.engine_core.shutdown()


def vllm_logprobs(llm) -> list[torch.Tensor]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=t) for t in TOKENS], params, use_tqdm=False)
    return [torch.tensor([lp[tok].logprob for lp, tok in zip(o.prompt_logprobs[1:], t[1:])])
            for o, t in zip(outs, TOKENS)]


def hf_logprobs(model_dir: Path, tensors: dict[str, torch.Tensor], scratch: Path) -> list[torch.Tensor]:
    """Transformers' log-probs of TOKENS with ``tensors`` as the checkpoint (written next to the config)."""
    target = scratch / "hf-reference"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(model_dir, target)
    save_file(tensors, str(target / "model.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for t in TOKENS:
            logits = model(torch.tensor([t])).logits[0, :-1]
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(t[1:])[:, None])[:, 0])
    return out


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


class FlipFirstSend:
    """Wraps a sender transport so the first bucket this process sends has one byte flipped after its
    checksum was taken (a corrupted link); later sends are clean."""

    def __init__(self, inner):
        self.inner, self.flipped = inner, False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def send(self, version, bucket, flat):
        if not self.flipped:
            flat[bucket.nbytes // 2] ^= 0x5A
            self.flipped = True
        self.inner.send(version, bucket, flat)


def flip_rank0(transport):
    """``wrap`` for LocalSenders: corrupt only the transport of the process that sends bucket 0."""
    return FlipFirstSend(transport)
