# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by the Slurm test, as root. start_slurm WORK starts a one-node Slurm cluster on
# loopback, everything under WORK: munged as the munge user with its own key and socket, then
# slurmctld and slurmd in the foreground with a generated slurm.conf (exported as SLURM_CONF
# for sbatch, srun and scontrol); it returns once the node is idle. stop_slurm cancels what is
# still queued and stops the three daemons; it is safe to call at any point.
slurm_pids=()
# slurmctld's and slurmd's ports, free ones (tests/free_ports.py).
read -r -a slurm_ports < <(python3 "$(dirname "${BASH_SOURCE[0]}")/free_ports.py" 2)

start_slurm() {
  local work=$1
  start_munged "$work/munge"
  write_slurm_conf "$work" >"$work/slurm.conf"
  export SLURM_CONF=$work/slurm.conf
  slurmctld -D -f "$SLURM_CONF" 2>>"$work/slurmctld.log" &
  slurm_pids+=($!)
  slurmd -D -f "$SLURM_CONF" 2>>"$work/slurmd.log" &
  slurm_pids+=($!)
  for _ in $(seq 150); do
    [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && return
    sleep 0.2
  done
  echo "the Slurm node did not become idle in 30 s; sinfo: $(sinfo 2>&1)"
  tail -n 20 "$work"/slurm*.log
  exit 1
}

# munged in the foreground as munge; its key, socket and logs in DIR.
start_munged() {
  local dir=$1
  mkdir -m 755 "$dir"  # munged wants its socket's folder open to all (the key is 0600)
  mungekey --create --keyfile="$dir/munge.key"
  chown -R munge:munge "$dir"
  setpriv --reuid=munge --regid=munge --clear-groups munged --foreground \
    --socket="$dir/munge.socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --seed-file="$dir/munged.seed" 2>"$dir/munged.log" &
  slurm_pids+=($!)
  for _ in $(seq 50); do
    [ -S "$dir/munge.socket" ] && return
    sleep 0.1
  done
  echo "munged did not create its socket in 5 s:"
  cat "$dir/munged.log"
  exit 1
}

# The slurm.conf of one node with this machine's short name and 2 CPUs (configured, whatever
# the machine has), on loopback; no cgroups (no systemd here) and no accounting.
write_slurm_conf() {
  local work=$1 node
  node=$(hostname -s)
  cat <<EOF
ClusterName=psched-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=${slurm_ports[0]}
SlurmdPort=${slurm_ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=psched Nodes=$node Default=YES MaxTime=10 State=UP
EOF
}

# Prints the final state of job ID (COMPLETED, FAILED, ...) once it has ended, or TIMEOUT
# after SECONDS.
wait_for_job() {
  local id=$1 seconds=$2 state
  for _ in $(seq $((seconds * 5))); do
    state=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $state in
      PENDING | CONFIGURING | RUNNING | COMPLETING | "") sleep 0.2 ;;
      *) echo "$state"; return ;;
    esac
  done
  echo TIMEOUT
}

stop_slurm() {
  if [ ${#slurm_pids[@]} -ge 3 ]; then  # slurmctld is up: cancel, and let slurmd clean up
    scancel --full --user=root 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  local i
  for ((i = ${#slurm_pids[@]} - 1; i >= 0; i--)); do stop_process "${slurm_pids[i]}"; done
  slurm_pids=()
}

# SIGTERM to PID, a child of this shell, then SIGKILL if it still runs after 10 s.
stop_process() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    running "$pid" || { wait "$pid" 2>/dev/null || true; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# Whether PID runs (an exited child not yet waited for is a zombie, state Z).
running() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ "$state" != Z ]
}
