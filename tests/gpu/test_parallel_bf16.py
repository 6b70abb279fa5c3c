"""Megatron log-probs vs transformers' in bf16 on one GPU (the "bench" tiny models, ~50M parameters).

bf16 keeps 8 mantissa bits, so two correct bf16 implementations that round in different places
disagree per token by a few 1e-2 on log-probs of about -9 (a vocabulary of 8192). The bounds:

- Megatron bf16 vs transformers bf16: mean abs diff < 0.03, max abs diff < 0.3;
- against the float32 transformers reference, Megatron's bf16 mean error is at most 1.5x
  transformers' own bf16 mean error + 0.005 (Megatron is no less accurate than transformers).

A mapping or masking bug moves log-probs by O(1) and fails all three.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from megatron_rl.contracts import TrainingBatch
from megatron_rl.tiny import make_tiny_model
from parallel.config import TrainerConfig

MEAN_TOL = 0.03
MAX_TOL = 0.3
ARCHS = ("qwen3", "qwen3_moe")


def _batch(vocab: int) -> TrainingBatch:
    g = torch.Generator().manual_seed(0)
    lengths = (512, 300, 64, 511)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attn = torch.zeros(len(lengths), max(lengths))
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(3, vocab, (n,), generator=g)
        attn[b, :n] = 1
    rows, width = ids.shape
    return TrainingBatch(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=attn.clone(),
        advantages=torch.zeros(rows, width),
        rollout_logprobs=torch.zeros(rows, width),
        group_ids=torch.arange(rows),
        trajectory_ids=[f"t{b}" for b in range(rows)],
        prompt_lengths=torch.ones(rows, dtype=torch.long),
    )


def _hf_logprobs(hf_dir, batch, dtype) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype).cuda().eval()
    ids, mask = batch.input_ids.cuda(), batch.attention_mask.cuda()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask.long()).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return (torch.nn.functional.pad(logp, (1, 0)) * mask).cpu()


def _megatron_logprobs(hf_dir, batch, port: int) -> torch.Tensor:
    from parallel.groups import destroy_distributed, init_distributed
    from parallel.logprob_pass import compute_logprobs
    from parallel.provider import load_model

    cfg = TrainerConfig(dtype="bfloat16", max_tokens_per_micro_batch=1024)
    pgs = init_distributed(cfg.parallel, 0, 1, f"tcp://127.0.0.1:{port}")
    try:
        model = load_model(hf_dir, cfg, pgs)
        return compute_logprobs(model, batch, cfg.max_tokens_per_micro_batch, pgs)[0]
    finally:
        destroy_distributed()


def _stats(a: torch.Tensor, b: torch.Tensor, live: torch.Tensor) -> tuple[float, float]:
    diff = (a - b).abs()[live]
    return float(diff.mean()), float(diff.max())


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_logprobs_match_transformers(arch, tmp_path):
    hf_dir = make_tiny_model(arch, tmp_path / arch, size="bench")
    from transformers import AutoConfig

    batch = _batch(AutoConfig.from_pretrained(str(hf_dir)).vocab_size)
    live = batch.attention_mask.bool().clone()
    live[:, 0] = False
    megatron = _megatron_logprobs(hf_dir, batch, 29600 + ARCHS.index(arch))
    hf_bf16 = _hf_logprobs(hf_dir, batch, torch.bfloat16)
    hf_fp32 = _hf_logprobs(hf_dir, batch, torch.float32)
    mean, worst = _stats(megatron, hf_bf16, live)
    mg_err, _ = _stats(megatron, hf_fp32, live)
    hf_err, _ = _stats(hf_bf16, hf_fp32, live)
    print(f"{arch}: megatron vs transformers bf16 mean {mean:.4f} max {worst:.4f}; "
          f"vs fp32 mean: megatron {mg_err:.4f}, transformers {hf_err:.4f}")
    assert mean < MEAN_TOL and worst < MAX_TOL, (mean, worst)
    assert mg_err <= 1.5 * hf_err + 0.005, (mg_err, hf_err)
