#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End to end over real sockets: psched-server on a test deployment, two example trainers
# whose loss must fall, then a clean stop on SIGTERM; then a shard on a missing GPU refused,
# shard indices that cannot be told from the environment (--shard-from), and a trainer told
# (WORLD_SIZE) another number of workers.
# Usage: server_process_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d)
trap 'kill -KILL $server 2>/dev/null || true; rm -rf "$work"' EXIT

source "$source/tests/process_lib.sh"
local_yaml "$source" "$work/test.yaml"
# ctest runs this over both data paths.
if [ -n "${PSCHED_TEST_DATA_PATH:-}" ]; then echo "data_path: $PSCHED_TEST_DATA_PATH" >> "$work/test.yaml"; fi
start_server "$build" "$work/test.yaml" "$work/server.log"

for w in 0 1; do
  "$build/apps/psched-example-trainer" --config "$work/test.yaml" --worker $w --steps 60 \
      --print-every 59 > "$work/trainer$w.log" &
  trainers[w]=$!
done
for w in 0 1; do wait "${trainers[w]}"; done

for w in 0 1; do
  cat "$work/trainer$w.log"
  floor=$(awk '/loss of the true model/{print $NF}' "$work/trainer$w.log")
  first=$(awk '/step +1 /{print $6}' "$work/trainer$w.log")
  last=$(awk '/step +60 /{print $6}' "$work/trainer$w.log")
  # The loss must fall, to within 0.1 of the true model's loss on the data.
  awk -v a="$first" -v b="$last" -v f="$floor" 'BEGIN { exit !(b < a && b < f + 0.1) }' ||
    { echo "worker $w: loss did not fall to the optimum ($first -> $last, optimum $floor)"; exit 1; }
done

kill -TERM $server
wait $server  # exits 0 after a clean stop; a hang is caught by ctest's timeout
grep -q 'stopping' "$work/server.log"
echo "server stopped cleanly"

# One process per shard (README), no --job: both processes name the job alike (by the
# deployment's shard addresses), so a trainer takes them as one job and trains.
local_yaml "$source" "$work/split.yaml"
if [ -n "${PSCHED_TEST_DATA_PATH:-}" ]; then echo "data_path: $PSCHED_TEST_DATA_PATH" >> "$work/split.yaml"; fi
for s in 0 1; do
  "$build/apps/psched-server" --config "$work/split.yaml" --shard $s 2>"$work/shard$s.log" &
  shard_servers[s]=$!
done
trap 'kill -KILL $server "${shard_servers[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
for s in 0 1; do await_logged "${shard_servers[s]}" "$work/shard$s.log" "listening on" 1; done
for w in 0 1; do
  "$build/apps/psched-example-trainer" --config "$work/split.yaml" --worker $w --steps 5 \
      --print-every 5 > "$work/split$w.log" 2>&1 &
  trainers[w]=$!
done
for w in 0 1; do
  wait "${trainers[w]}" || { echo "worker $w on one process a shard:"; cat "$work/split$w.log"; exit 1; }
done
kill -TERM "${shard_servers[@]}"
wait "${shard_servers[@]}"
echo "one process a shard, no --job: trained"

# A shard on a GPU this machine lacks is refused at start, naming the file, shard and device.
sed -e '0,/^    http: /s/^    http: .*$/&\n    device: cuda:1000/' "$work/test.yaml" > "$work/gpu.yaml"
status=0
"$build/apps/psched-server" --config "$work/gpu.yaml" 2>"$work/gpu.log" || status=$?
if ! grep -q "gpu.yaml: shards\[0\].device: device cuda:1000 is not available: " "$work/gpu.log" ||
  [ $status -ne 2 ]; then
  cat "$work/gpu.log"
  echo "expected exit 2, got $status"
  exit 1
fi
echo "a shard on a missing GPU is refused: $(cat "$work/gpu.log")"

# A server that cannot tell its shard from the environment says which variable it looked for.
expect_refused() {  # VARIABLE EXPECTED-MESSAGE [ENVIRONMENT...]: psched-server --shard-from VARIABLE
  local variable=$1 expected=$2 status=0
  shift 2
  env "$@" "$build/apps/psched-server" --config "$work/test.yaml" --shard-from "$variable" \
    2>"$work/env.log" || status=$?
  if ! grep -qF "$expected" "$work/env.log" || [ $status -ne 2 ]; then
    cat "$work/env.log"
    echo "expected exit 2 with: $expected; got $status"
    exit 1
  fi
  echo "refused: $(cat "$work/env.log")"
}
expect_refused SLURM_PROCID "no shard index: the environment has no SLURM_PROCID" -u SLURM_PROCID
expect_refused SLURM_PROCID 'SLURM_PROCID="x" holds no index' SLURM_PROCID=x
expect_refused POD_NAME \
  "test.yaml: there is no shard 7 (from POD_NAME=psched-shard-7) (the file names 2)" \
  POD_NAME=psched-shard-7

# A trainer started for another number of workers than the deployment's is refused.
status=0
WORLD_SIZE=3 "$build/apps/psched-example-trainer" --config "$work/test.yaml" 2>"$work/world.log" ||
  status=$?
if ! grep -qF "WORLD_SIZE=3 but $work/test.yaml has workers: 2" "$work/world.log" ||
  [ $status -ne 1 ]; then
  cat "$work/world.log"
  echo "expected exit 1 naming WORLD_SIZE; got $status"
  exit 1
fi
echo "refused: $(cat "$work/world.log")"
