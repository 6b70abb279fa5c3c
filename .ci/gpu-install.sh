#!/usr/bin/env bash
# On a CUDA machine with Python 3.12 and torch 2.11 but no registry: join the pieces that .ci/gpu-wheels.sh made
# and install them into a folder that goes on PYTHONPATH (the image's own torch, triton and numpy stay as they are).
# Usage: bash .ci/gpu-install.sh PIECES_DIR SITE_DIR   then   export PYTHONPATH=<this repository>:SITE_DIR
# The repository goes first: the site's copy of megatron-rl is there for its entry points (vLLM finds the project's
# plugin through them), and the working tree's code is what runs.
set -euo pipefail
pieces=${1:?usage: gpu-install.sh PIECES_DIR SITE_DIR}
site=${2:?usage: gpu-install.sh PIECES_DIR SITE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat "$pieces"/p* | tar x -C "$work"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$work"/wheels/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-build-isolation --target "$site" "$work"/wheels/*.tar.gz
PYTHONPATH="$site" python3 -c "import torch, vllm, megatron.core, ray, hydra; from importlib.metadata import entry_points; assert entry_points(group='vllm.general_plugins', name='megatron_rl_engine_guard'), 'the project wheel is missing'; print('megatron-rl GPU site ready: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'cuda', torch.cuda.is_available())"
