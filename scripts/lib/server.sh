# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by scripts: start_server CONFIG starts build/apps/psched-server on every shard of the
# deployment CONFIG, waits (bounded) until each shard listens and serves its dashboard, prints
# the server's log so far (in $server_log), and stops the server when the calling script exits.
start_server() {
  local config=$1 shards
  server_log=$(mktemp -t psched-server.XXXXXX.log)
  build/apps/psched-server --config "$config" 2>"$server_log" &
  server=$!
  trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$server_log"' EXIT

  # The server writes one line per listening shard and one per dashboard.
  shards=$(grep -c '^\s*- listen:' "$config")
  for _ in $(seq 200); do
    [ "$(grep -c 'listening on' "$server_log")" -ge "$shards" ] &&
      [ "$(grep -c 'dashboard on' "$server_log")" -ge "$shards" ] && break
    kill -0 $server 2>/dev/null || { cat "$server_log"; exit 1; }
    sleep 0.05
  done
  cat "$server_log"
}

# stop_server: SIGTERMs the server start_server started and waits for it to end (with a
# checkpoint: section, each shard's last checkpoint is written then).
stop_server() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
