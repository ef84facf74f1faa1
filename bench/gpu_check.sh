#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check, for a machine with an NVIDIA GPU and the CUDA toolkit (docs/gpu.md): builds
# the CUDA code in build-cuda (separate from build/; RelWithDebInfo, as psched-server is built
# by default), runs the GPU tests, then the apply benchmark (its CPU rows, then CPU vs GPU vs
# the GPU's copy bandwidths, 4 MiB to 1 GiB, all measured in this run). Works from a clean
# checkout, offline; about 2-3 minutes on 16 cores. Exits nonzero when the build fails, no GPU is usable, or a
# test fails.
# Usage: bench/gpu_check.sh [extra psched-apply-bench options]
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
build="build-cuda"
jobs=$(nproc)

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader || echo "gpu_check: nvidia-smi not found (continuing)"

echo "== configure and build ($build, CUDA on, sm_90) =="
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DPSCHED_CUDA=ON -DPSCHED_STRICT=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
ninja -C "$build" -j"$jobs" gpu_test optim_test psched-apply-bench
echo "built in $((SECONDS - start)) s"

echo "== CPU kernels (optim_test) =="
"$build/optim/optim_test" --minimal && echo "optim_test passed"
echo "== GPU tests (gpu_test) =="
status=0
"$build/actors/shard/gpu_test" || status=$?
if [ $status -eq 77 ]; then
  echo "gpu_check: FAILED: gpu_test found no usable GPU (see above)"; exit 1
elif [ $status -ne 0 ]; then
  echo "gpu_check: FAILED: gpu_test exited $status"; exit 1
fi

echo "== apply benchmark =="
"$build/bench/psched-apply-bench" "$@"
echo "gpu_check: OK in $((SECONDS - start)) s"
