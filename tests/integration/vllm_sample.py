"""Sample from a checkpoint with vLLM's offline engine; print token ids and log-probs as JSON.

Run as a script (vLLM spawns workers, so engines are made under ``__main__``):
    python tests/integration/vllm_sample.py MODEL_DIR PROMPT_IDS_JSON MAX_TOKENS
"""

import json
import sys


def main(model: str, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model, dtype="float32", enforce_eager=True, max_model_len=256, seed=0, kv_cache_memory_bytes=1 << 28)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=0, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    results = []
    for out in outs:
        c = out.outputs[0]
        results.append({"ids": list(c.token_ids), "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]})
    return results


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))))
