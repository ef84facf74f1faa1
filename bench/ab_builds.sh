#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Same-run A/B of two builds of psched on this machine, the benchmarks interleaved (ratios move
# between machines and between hours: compare only within one run):
#   bench/ab_builds.sh BASE_BUILD NEW_BUILD OUT [ROUNDS]
# BASE_BUILD, NEW_BUILD: build folders (e.g. a `git worktree` of the previous commit, built with
# scripts/build). Per round and build: bench/data_path_bars.py's transport and scheduling runs
# (unscaled ResNet-50 at 4 and 10 Gbit/s among them), psched-transport-bench at 256 KiB with 8
# workers (the noisiest bar, measured again), bench/torch_e2e.py ResNet-18 against DDP at three
# rates, and bench/membership_bench.py. OUT gets every JSON and log, and a report per build of
# the bars (data_path_bars.py report). Needs root for the shaped links, as the benchmarks do.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 3 ]; then
  sed -n '3,12p' "$0" >&2
  exit 2
fi
declare -A build=([base]=$(realpath "$1") [new]=$(realpath "$2"))
out=$3
rounds=${4:-3}
mkdir -p "$out"
python=/usr/bin/python3  # Debian's, which sees python3-torch (docs/design.md)

for round in $(seq 1 "$rounds"); do
  for b in base new; do
    echo "== round $round: $b ($(date +%T))"
    python3 bench/data_path_bars.py run --build "${build[$b]}" --runs 1 \
      --out "$out/bars-$b-$round" >"$out/bars-$b-$round.txt" 2>&1
    "${build[$b]}/bench/psched-transport-bench" --sizes 256KiB --seconds 1 --workers 8 \
      --json "$out/t256-$b-$round.json" >"$out/t256-$b-$round.txt" 2>&1
    "$python" bench/torch_e2e.py --models resnet18 --modes priority,ddp \
      --rates unshaped,equal,exceed --steps 20 --warmup 5 --repeats 2 --check '' \
      --build "${build[$b]}" --json "$out/e2e-$b-$round.json" >"$out/e2e-$b-$round.txt" 2>&1
    python3 bench/membership_bench.py --build "${build[$b]}" --repeat 1 \
      >"$out/membership-$b-$round.txt" 2>&1
  done
done

# Each build's bars as one report over its rounds (data_path_bars.py reads stem-N.json).
for b in base new; do
  mkdir -p "$out/bars-$b"
  for round in $(seq 1 "$rounds"); do
    for file in "$out/bars-$b-$round"/*-1.json; do
      cp "$file" "$out/bars-$b/$(basename "$file" -1.json)-$round.json"
    done
  done
  python3 bench/data_path_bars.py report "$out/bars-$b" >"$out/bars-$b.report"
  echo "== $b: $out/bars-$b.report"
done
