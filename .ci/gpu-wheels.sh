#!/usr/bin/env bash
# Prepare, on a machine with PyPI, every wheel a CUDA machine with Python 3.12 and the image's torch 2.11 lacks
# for megatron-rl: vLLM 0.26.0 (the release pinned to torch 2.11, a CUDA 13 build) and its small dependencies,
# megatron-core, Ray, Hydra, and the project's own wheel (for its entry points: the vLLM plugin that ties a
# managed server's engine core to its API server). Output: OUT/p0 ... pN (pieces of at most 58 MiB, for
# transfers limited to 64 MiB).
# Install them on the GPU machine with .ci/gpu-install.sh (README: "GPU machines without a registry").
# Usage: bash .ci/gpu-wheels.sh OUT_DIR
set -euo pipefail
out=${1:?usage: gpu-wheels.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out" && mkdir -p "$out/wheels"
platforms=()
for tag in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
           manylinux_2_17 manylinux2014 linux; do platforms+=(--platform "${tag}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${platforms[@]}" --platform any -d "$out/wheels" -r "$here/gpu-pins.txt"
# Hydra's grammar runtime exists only as a source distribution; it installs offline without build isolation.
python3 -m pip download -q --no-deps --no-binary=:all: -d "$out/wheels" antlr4-python3-runtime==4.9.3
python3 -m pip wheel -q --no-deps -w "$out/wheels" "$here/.."
(cd "$out" && tar cf w.tar wheels && rm -r wheels && split -b 58M -d -a 1 w.tar p && rm w.tar && ls -la p*)
