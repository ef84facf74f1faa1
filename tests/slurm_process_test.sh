#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# deploy/slurm/psched.sbatch on a real one-node Slurm cluster: starts munged, slurmctld and
# slurmd on loopback with a generated slurm.conf, submits the script with sbatch (two shards,
# two example trainers), and checks that the job succeeded, both trainers' loss fell, both
# shards stopped cleanly, and every line of the job's output is whole. Trainer 1 fails once,
# after 50 of its 100 steps: the script starts it again (PSCHED_TRAINER_RESTARTS=1) and it
# rejoins the running job at its step. Then the job grows, as deploy/slurm/psched.sbatch's
# header tells an operator: its checkpoint folder moved aside, a second sbatch on three shards
# with PSCHED_RESHARD_FROM naming it places the job's checkpoints on them (`psched reshard`),
# and both trainers resume at the job's step (101, or 102 for one that joins after the other
# pushed step 101) with the loss where it was, to step 150 (the same checks of its output). Stops the daemons it started, also on failure. Needs
# root (munged runs as the munge user, slurmd as root) and Debian's slurm-wlm and munge
# (scripts/setup); exits 77 (skipped) without them.
# Usage: slurm_process_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1")
source=$(realpath "$2")

if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: needs root to run munged as munge and slurmd"
  exit 77
fi
for tool in mungekey munged slurmctld slurmd sbatch scontrol sinfo; do
  command -v $tool >/dev/null ||
    { echo "skipped: no $tool (scripts/setup installs slurm-wlm and munge)"; exit 77; }
done

work=$(mktemp -d /tmp/psched-slurm.XXXXXX)
chmod 755 "$work"  # munged, as munge, reaches its folder inside
source "$source/tests/slurm_lib.sh"
trap 'stop_slurm; rm -rf "$work"' EXIT
start_slurm "$work"

# The job: the shipped base file with a checkpoint folder, a token beside it, two shards and two
# trainers on the node.
cp "$source/deploy/slurm/psched.yaml" "$work/psched.yaml"
echo "checkpoint: {directory: $work/psched-state, interval_seconds: 300}" >>"$work/psched.yaml"
(umask 077; head -c 32 /dev/urandom | base64 >"$work/psched.token")
# Two shards count their ports up from PSCHED_PORT, their operator views from it + 1000.
port=$(python3 "$source/tests/free_ports.py" --at 0,1,1000,1001)
cat >"$work/trainer.sh" <<EOF
#!/usr/bin/env bash
# Trainer 1's first run stops after step 50 and fails; every other run trains 100 steps.
if [ "\$RANK" = 1 ] && [ ! -e "$work/failed-once" ]; then
  touch "$work/failed-once"
  "$build/apps/psched-example-trainer" --steps 50 --print-every 99
  exit 9
fi
exec "$build/apps/psched-example-trainer" --steps 100 --print-every 99
EOF
chmod +x "$work/trainer.sh"
# Submits the script with TRAINER on the node, the variables NAME=VALUE added, its output in
# OUTPUT; prints that output, and fails unless the job completed.
run_job() {  # OUTPUT TRAINER NAME=VALUE...
  local output=$1 trainer=$2 job state
  shift 2
  job=$(env "$@" PSCHED_BIN="$build/apps" PSCHED_START_TIMEOUT=20 \
    sbatch --parsable --nodes=1 --ntasks=2 --chdir="$work" --output="$output" \
    "$source/deploy/slurm/psched.sbatch" "$work/psched.yaml" "$trainer")
  echo "submitted job $job"
  state=$(wait_for_job "$job" 90)
  echo "---- sbatch output of job $job ($state) ----"
  cat "$output"
  echo "----"
  [ "$state" = COMPLETED ] || { echo "job $job ended $state, expected COMPLETED"; exit 1; }
}
run_job "$work/job.out" "$work/trainer.sh" PSCHED_SHARDS=2 PSCHED_PORT="$port" \
  PSCHED_TRAINER_RESTARTS=1

# Trainer lines carry srun's task label: "1: worker 1 step  100  loss 0.1917  accuracy 0.937".
loss_at() {  # OUTPUT WORKER STEP
  awk -v w="$2" -v s="$3" '$2 == "worker" && $3 == w && $4 == "step" && $5 == s {print $7}' "$1"
}
optimum() {  # OUTPUT WORKER: the loss of the true model, as the trainer printed it
  awk -v w="$2" '$3 == w":" && /loss of the true model/ {print $NF; exit}' "$1"
}
near='BEGIN { exit !(b != "" && b < f + 0.1) }'  # to within 0.1 of the optimum
for w in 0 1; do
  floor=$(optimum "$work/job.out" $w)
  first=$(loss_at "$work/job.out" $w 1)
  last=$(loss_at "$work/job.out" $w 100)
  if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b < a) }' ||
    ! awk -v b="$last" -v f="$floor" "$near"; then
    echo "worker $w: loss did not fall to the optimum ($first -> $last, optimum $floor)"
    exit 1
  fi
  echo "worker $w: loss $first -> $last (the true model's: $floor)"
done

if ! grep -q 'psched.sbatch: trainer 1 exited with status 9; starting it again' "$work/job.out" ||
  ! grep -qE 'worker 1 joins the job at step [0-9]+' "$work/job.out"; then
  echo "trainer 1 was not started again, or did not rejoin the job"
  exit 1
fi
grep -E 'worker 1 joins the job' "$work/job.out"

# Every line of a job's output whole: srun's task label, then one line of a trainer, a shard's
# log or psched.sbatch (and `psched reshard`, through it); psched status's table; slurmstepd's
# note of the cancelled shard step.
whole='^[0-9]+: worker [0-9]+( step +[0-9]+  loss [0-9.]+  accuracy [0-9.]+| joins the job at step [0-9]+|: [0-9]+ features, [0-9]+ samples, loss of the true model [0-9.]+)$'
whole+='|^([0-9]+: )?psched\.sbatch: |^[0-9]+: [0-9-]+T[0-9:]+Z (debug|info|warn|error) '
whole+='|^shard state  http |^[0-9]+ +(up|down) +[^ ]+:[0-9]+|^shard [0-9]+: members '
whole+='|^placement shard [0-9]+: job [0-9a-f]{16}, slot map epoch [0-9]+ on [0-9]+ shard\(s\), [0-9]+ of [0-9]+ slots$'
whole+='|^[0-9]+: slurmstepd-[^ ]+: error: \*\*\* STEP [0-9.]+ ON [^ ]+ CANCELLED AT [0-9T:-]+ \*\*\*$'
check_output() {  # OUTPUT SHARDS: every line whole, every shard stopped cleanly
  if grep -vE "$whole" "$1"; then
    echo "the lines above of $1 are broken or unexpected"
    exit 1
  fi
  echo "every line of $1 is whole"
  stopped=$(grep -c 'psched-server: signal 15 received, stopping' "$1" || true)
  if [ "$stopped" -ne "$2" ] ||
    ! grep -q "psched.sbatch: all $2 shard(s) stopped cleanly" "$1"; then
    echo "expected all $2 shards to stop cleanly on SIGTERM; $stopped did"
    exit 1
  fi
  echo "all $2 shards stopped cleanly"
}
check_output "$work/job.out" 2

# The job grown to three shards: its checkpoints moved aside, placed on three by the script.
mv "$work/psched-state" "$work/psched-state.2-shards"
printf '#!/usr/bin/env bash\nexec %q --steps 150 --print-every 99\n' \
  "$build/apps/psched-example-trainer" >"$work/trainer2.sh"
chmod +x "$work/trainer2.sh"
port=$(python3 "$source/tests/free_ports.py" --at 0,1,2,1000,1001,1002)
run_job "$work/job2.out" "$work/trainer2.sh" PSCHED_SHARDS=3 PSCHED_PORT="$port" \
  PSCHED_RESHARD_FROM="$work/psched-state.2-shards"
grep -q 'psched.sbatch: reshard: placed the job of 2 shard(s) on 3: slot map epoch 2' \
  "$work/job2.out" || { echo "psched reshard did not place the job on 3 shards"; exit 1; }
if [ "$(grep -c 'slot map epoch 2 on 3 shard(s)' "$work/job2.out")" -ne 3 ]; then
  echo "the 3 shards did not start from the resharded checkpoints (slot map epoch 2)"
  exit 1
fi
for w in 0 1; do
  # At the job's step, 101, or at 102 where the other worker pushed step 101 first.
  at=$(sed -nE "s/^$w: worker $w joins the job at step ([0-9]+)$/\1/p" "$work/job2.out")
  if [ "$at" != 101 ] && [ "$at" != 102 ]; then
    echo "worker $w did not resume the job at step 101 or 102 (joined at '$at')"
    exit 1
  fi
  floor=$(optimum "$work/job2.out" $w)
  resumed=$(loss_at "$work/job2.out" $w "$at")
  if ! awk -v b="$resumed" -v f="$floor" "$near"; then
    echo "worker $w: the loss at step $at is $resumed, not near the optimum $floor it had reached"
    exit 1
  fi
  echo "worker $w: resumed on 3 shards at step $at, loss $resumed (the true model's: $floor)"
done
check_output "$work/job2.out" 3
