#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# deploy/slurm/psched.sbatch on a real one-node Slurm cluster: starts munged, slurmctld and
# slurmd on loopback with a generated slurm.conf, submits the script with sbatch (two shards,
# two example trainers), and checks that the job succeeded, both trainers' loss fell, both
# shards stopped cleanly, and every line of the job's output is whole. Trainer 1 fails once,
# after 50 of its 100 steps: the script starts it again (PSCHED_TRAINER_RESTARTS=1) and it
# rejoins the running job at its step. Stops the daemons it started, also on failure. Needs
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

# The job: the shipped base file, a token beside it, two shards and two trainers on the node.
cp "$source/deploy/slurm/psched.yaml" "$work/psched.yaml"
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
job=$(PSCHED_SHARDS=2 PSCHED_PORT=$port PSCHED_BIN="$build/apps" PSCHED_START_TIMEOUT=20 \
  PSCHED_TRAINER_RESTARTS=1 \
  sbatch --parsable --nodes=1 --ntasks=2 --chdir="$work" --output="$work/job.out" \
  "$source/deploy/slurm/psched.sbatch" "$work/psched.yaml" "$work/trainer.sh")
echo "submitted job $job"
state=$(wait_for_job "$job" 90)
echo "---- sbatch output of job $job ($state) ----"
cat "$work/job.out"
echo "----"
[ "$state" = COMPLETED ] || { echo "job $job ended $state, expected COMPLETED"; exit 1; }

# Trainer lines carry srun's task label: "1: worker 1 step  100  loss 0.1917  accuracy 0.937".
loss_at() {  # WORKER STEP
  awk -v w="$1" -v s="$2" '$2 == "worker" && $3 == w && $4 == "step" && $5 == s {print $7}' \
    "$work/job.out"
}
for w in 0 1; do
  floor=$(awk -v w=$w '$3 == w":" && /loss of the true model/ {print $NF; exit}' "$work/job.out")
  first=$(loss_at $w 1)
  last=$(loss_at $w 100)
  fell='BEGIN { exit !(a != "" && b < a && b < f + 0.1) }'  # to within 0.1 of the optimum
  if ! awk -v a="$first" -v b="$last" -v f="$floor" "$fell"; then
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

# Every line of the job's output whole: srun's task label, then one line of a trainer, a shard's
# log or psched.sbatch; psched status's table; slurmstepd's note of the cancelled shard step.
whole='^[0-9]+: worker [0-9]+( step +[0-9]+  loss [0-9.]+  accuracy [0-9.]+| joins the job at step [0-9]+|: [0-9]+ features, [0-9]+ samples, loss of the true model [0-9.]+)$'
whole+='|^([0-9]+: )?psched\.sbatch: |^[0-9]+: [0-9-]+T[0-9:]+Z (debug|info|warn|error) '
whole+='|^shard state  http |^[0-9]+ +(up|down) +[^ ]+:[0-9]+|^shard [0-9]+: members '
whole+='|^placement shard [0-9]+: job [0-9a-f]{16}, slot map epoch [0-9]+ on [0-9]+ shard\(s\), [0-9]+ of [0-9]+ slots$'
whole+='|^[0-9]+: slurmstepd-[^ ]+: error: \*\*\* STEP [0-9.]+ ON [^ ]+ CANCELLED AT [0-9T:-]+ \*\*\*$'
if grep -vE "$whole" "$work/job.out"; then
  echo "the lines above are broken or unexpected"
  exit 1
fi
echo "every line of the job's output is whole"

stopped=$(grep -c 'psched-server: signal 15 received, stopping' "$work/job.out" || true)
if [ "$stopped" -ne 2 ] ||
  ! grep -q 'psched.sbatch: all 2 shard(s) stopped cleanly' "$work/job.out"; then
  echo "expected both shards to stop cleanly on SIGTERM; $stopped did"
  exit 1
fi
echo "both shards stopped cleanly"
