#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# TLS and the auth token over real sockets: psched-server serving TLS and asking for a token
# from a file; an example trainer that trains through it; a trainer without TLS refused while
# the server keeps serving; a trainer that trusts another CA told which shard it could not trust;
# a trainer whose host has only the CA (not the shards' certificate and key) trains.
# Usage: tls_process_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d)
trap 'kill -KILL $server 2>/dev/null || true; rm -rf "$work"' EXIT

cp "$source"/tests/tls/{ca.pem,other_ca.pem,server.pem,server.key} "$work/"
printf 's3cret\n' > "$work/token"
chmod 600 "$work/server.key" "$work/token"
source "$source/tests/process_lib.sh"
local_yaml "$source" "$work/plain.yaml"
first_shard=$(awk '/listen:/ { print $NF; exit }' "$work/plain.yaml")
echo 'auth: {token_file: token}' >> "$work/plain.yaml"
# ctest runs this over both data paths.
if [ -n "${PSCHED_TEST_DATA_PATH:-}" ]; then echo "data_path: $PSCHED_TEST_DATA_PATH" >> "$work/plain.yaml"; fi
tls_yaml() {  # CA_FILE OUT
  cp "$work/plain.yaml" "$work/$2"
  echo "tls: {cert_file: server.pem, key_file: server.key, ca_file: $1}" >> "$work/$2"
}
tls_yaml ca.pem tls.yaml
tls_yaml other_ca.pem other_ca.yaml
# What a worker's host has when only the CA is handed out (deploy/kubernetes/trainers.yaml).
sed -e 's/cert_file: server.pem, key_file: server.key/cert_file: absent.pem, key_file: absent.key/' \
    "$work/tls.yaml" > "$work/ca_only.yaml"

start_server "$build" "$work/tls.yaml" "$work/server.log" 'listening on .* (TLS)'

train() {  # YAML [WORKER]: runs one trainer (default worker 0), its output in $work/YAML.log
  "$build/apps/psched-example-trainer" --config "$work/$1" --worker "${2:-0}" --steps 20 \
      --print-every 19 > "$work/$1.log" 2>&1
}
expect_refused() {  # YAML TEXT: the trainer fails and says TEXT
  if train "$1"; then echo "$1: the trainer was served"; exit 1; fi
  cat "$work/$1.log"
  grep -qF "$2" "$work/$1.log" || { echo "$1: expected '$2' in the error"; exit 1; }
}

expect_refused plain.yaml "connection to the shard lost"
grep -q 'TLS handshake failed, connection dropped' "$work/server.log"
expect_refused other_ca.yaml "TLS handshake with shard at $first_shard failed"
grep -qF "not trusted" "$work/other_ca.yaml.log"
train tls.yaml || { cat "$work/tls.yaml.log" "$work/server.log"; exit 1; }
grep -E 'step +20 ' "$work/tls.yaml.log"
# Worker 1: worker 0 has trained its 20 steps (a restarted worker 0 would go on at step 21).
train ca_only.yaml 1 || { cat "$work/ca_only.yaml.log"; exit 1; }
grep -E 'step +20 ' "$work/ca_only.yaml.log"

kill -TERM $server
wait $server
echo "TLS served (also to a worker with only the CA), plain and untrusted clients refused, server stopped cleanly"
