# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by the process tests.

# start_server BUILD CONFIG LOG [LINE] starts psched-server on every shard of CONFIG, its log
# in LOG and its pid in $server, and waits until two shards log LINE (a grep pattern; default
# 'listening on'). Exits, printing the log, if the server dies first or has not logged LINE
# twice after 60 s. The caller stops the server.
start_server() {
  local build=$1 config=$2 log=$3 line=${4:-listening on}
  "$build/apps/psched-server" --config "$config" 2>"$log" &
  server=$!
  await_logged $server "$log" "$line" 2
}

# await_logged PID LOG LINE COUNT waits until LOG holds COUNT lines matching LINE (a grep
# pattern) of the psched-server PID. Exits, printing the log, if the server dies first or has
# not logged them after 60 s.
await_logged() {
  local pid=$1 log=$2 line=$3 count=$4
  for _ in $(seq 1200); do
    [ "$(grep -c "$line" "$log")" -ge "$count" ] && return
    kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.05
  done
  cat "$log"
  echo "psched-server did not log '$line' $count time(s) within 60 s"
  exit 1
}

# local_yaml SOURCE OUT writes configs/local.yaml to OUT with its four ports (two shards' RPC
# and HTTP) replaced by ports the kernel picks (tests/free_ports.py), so that runs at once do
# not share them.
local_yaml() {
  local ports
  read -r -a ports < <(python3 "$1/tests/free_ports.py" 4)
  sed -e "s/:7410$/:${ports[0]}/; s/:7411$/:${ports[1]}/; s/:8410$/:${ports[2]}/" \
      -e "s/:8411$/:${ports[3]}/" "$1/configs/local.yaml" > "$2"
}
