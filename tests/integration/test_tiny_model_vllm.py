"""Tiny models load with transformers and vLLM's CPU build, and the two agree on log-probs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from megatron_rl.tiny import make_tiny_model

SCRIPT = Path(__file__).with_name("vllm_sample.py")


def vllm_sample(model: Path, prompts: list[list[int]], max_tokens: int, tmp_path: Path) -> list[dict]:
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "TMPDIR": str(tmp_path), "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(model), json.dumps(prompts), str(max_tokens)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def hf_logprobs(model_dir: Path, prompt: list[int], ids: list[int]) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seq = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_vllm_and_transformers_agree_on_sampled_logprobs(arch, tmp_path):
    model = make_tiny_model(arch, size="unit")
    tok = transformers.AutoTokenizer.from_pretrained(model)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in ("What is 12 + 30?", "Schedule the battery.")
    ]
    prompts = [list(p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p) for p in prompts]
    results = vllm_sample(model, prompts, max_tokens=24, tmp_path=tmp_path)
    for prompt, out in zip(prompts, results):
        assert len(out["ids"]) == 24 and all(0 <= t < len(tok) for t in out["ids"])
        expected = hf_logprobs(model, prompt, out["ids"])
        diff = (torch.tensor(out["logprobs"]) - expected).abs().max().item()
        assert diff < 1e-3, f"{arch}: vLLM and transformers log-probs differ by {diff}"
