# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by the process tests: start_server BUILD CONFIG LOG [LINE] starts psched-server on
# every shard of CONFIG, its log in LOG and its pid in $server, and waits (bounded) until two
# shards log LINE (a grep pattern; default 'listening on'). Exits, printing the log, if the
# server dies first. The caller stops the server.
start_server() {
  local build=$1 config=$2 log=$3 line=${4:-listening on}
  "$build/apps/psched-server" --config "$config" 2>"$log" &
  server=$!
  for _ in $(seq 400); do
    [ "$(grep -c "$line" "$log")" -ge 2 ] && return
    kill -0 $server 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.05
  done
}
