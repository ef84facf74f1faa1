#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Re-runs the scaled psched-bench results of this folder (README.md): 2 workers, 2 shards, sync
# mode, tc tbf between network namespaces (root), 8 iterations per policy, today's defaults
# (partitions 256 KiB, credit 2 MiB). Rates: each model's balanced rate
# (communication = compute), 4x lower, 100x higher. About 15 minutes on a quiet 2-core VM.
#
#   bench/results/run_scaled.sh [path/to/psched-bench]
set -eu
bench=${1:-build/bench/psched-bench}
here=$(dirname "$0")

run() {  # run NAME MODEL [options...]
  name=$1 model=$2
  shift 2
  echo "== $name" >&2
  "$bench" --model "$model" --workers 2 --shards 2 --mode sync --shaping tbf --iters 8 \
    --json "$here/$name.json" "$@"
}

partitioned=fifo,priority,partition-only,priority-only
# Balanced rates as psched-bench computes them from each profile (its default --bandwidth).
run resnet50-balanced resnet50 --policy "$partitioned"
run resnet50-low4x resnet50 --bandwidth 3.6812gbit --policy "$partitioned"
run resnet50-high100x resnet50 --bandwidth 1472.48gbit --policy fifo,priority
run transformer-balanced transformer --policy "$partitioned"
run transformer-low4x transformer --bandwidth 5.7154gbit --policy "$partitioned"
run transformer-high100x transformer --bandwidth 2286.144gbit --policy fifo,priority
run vgg16-balanced vgg16 --policy "$partitioned"
run vgg16-low4x vgg16 --bandwidth 5.2268gbit --policy "$partitioned"
run vgg16-high100x vgg16 --bandwidth 2090.712gbit --policy fifo,priority
