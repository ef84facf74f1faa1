#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sync membership against real processes on loopback (docs/reliability.md):

  members   psched-server (2 shards), 4 psched-member-client workers, sync, min_workers 2,
            lease_seconds 2: worker 3 is killed (SIGKILL) mid-run; the other three go on once
            its lease ends; a new process with id 3 rejoins at the step the shards give it and
            trains to the end. The shards' values then equal, bit for bit, a sequential replay
            of the recorded membership of every step (/membership: who gave each range of each
            step applied short-handed; every other range had all four).
  restart   the same, and psched-server is killed and restarted on its checkpoint directory
            twice: after worker 3 left and before it rejoins, and again as soon as the new
            worker 3 has joined (its join must come back from the update log).
  digits    python/examples/train_digits.py, 3 workers, 40 epochs, lease_seconds 3: worker 2 is
            killed after its second epoch, the other two finish two more epochs, then a new
            RANK=2 process joins at the job's step and prints only the epochs that remain; all
            three end with the same test accuracy. The new process is started at the kill and
            runs the example once the two more epochs are done: importing torch takes longer
            than the job's remaining epochs on a fast machine.
  bounded   the digits example, 3 workers, 40 epochs, in sync mode and in bounded mode
            (staleness 2): both reach a test accuracy of at least 0.9, within 1 point.
  staleness psched-server (2 shards, --trace), 4 psched-member-client workers in bounded mode
            (staleness 2) with a straggler that moves between them: from what the shards
            recorded (their trace), no poll for step s was answered before every member's
            pushes of step s - 2 of that variable had arrived, some poll did run ahead of
            another worker, and the final values equal the exact sum of every gradient (each
            push is applied on arrival; integers add exactly).
  torchrun  the digits example under torchrun (3 processes, --max-restarts 2): the RANK=2
            process is SIGKILLed after epoch 2, the agent restarts the group, every new process
            rejoins at the job's step, and all end at epoch 40 with the loss fallen.

Usage: membership_process_test.py members|restart|digits|bounded|torchrun|staleness BUILD_DIR
       SOURCE_DIR
Needs numpy (the replay); digits also torch and scikit-learn (the trainers).
"""
import bisect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from free_ports import free_ports
from process_checks import check, fail, wait_until

try:
    import numpy as np
except ImportError:
    print("membership_process_test: skipped: numpy is missing (scripts/setup installs it)")
    sys.exit(77)

PORTS = free_ports(4)  # one call: distinct
LISTEN, HTTP = PORTS[:2], PORTS[2:]
ELEMENTS = (40000, 12000, 900)  # tests/member_client.cc's variables
STEPS = 400


class Job:
    """A deployment in a temp dir: its server and its workers, each with a log."""

    def __init__(self, build, name, workers, extra="", mode="sync", lease=2):
        self.build = build
        self.work = tempfile.mkdtemp(prefix=f"psched_{name}_")
        text = (f"mode: {mode}\nworkers: {workers}\n"
                f"sync: {{min_workers: 2, lease_seconds: {lease}}}\n"
                "split_bytes: 64KiB\nscheduler: {partition_bytes: 16KiB}\n"
                "reconnect: {timeout_seconds: 30}\nshards:\n")
        for listen, http in zip(LISTEN, HTTP):
            text += f"  - {{listen: 127.0.0.1:{listen}, http: 127.0.0.1:{http}}}\n"
        self.config = os.path.join(self.work, "job.yaml")
        with open(self.config, "w") as f:
            f.write(text + extra)
        self.server = None
        self.server_log = os.path.join(self.work, "server.log")
        self.workers = {}  # id -> its newest process

    def start_server(self, *options):
        start = os.path.getsize(self.server_log) if os.path.exists(self.server_log) else 0
        self.server = subprocess.Popen(
            [os.path.join(self.build, "apps", "psched-server"), "--config", self.config,
             *options], stderr=open(self.server_log, "a"))
        wait_until(lambda: self.server_text()[start:].count("listening on") == 2 or
                   self.server.poll() is not None, "psched-server to listen", timeout=30)
        check(self.server.poll() is None, "psched-server exited:\n" + self.server_text())

    def restart_server(self):
        """SIGKILL, then a new psched-server on the same checkpoint directory."""
        self.server.send_signal(signal.SIGKILL)
        self.server.wait()
        restored = self.server_text().count("restored")
        self.start_server()
        check(self.server_text().count("restored") > restored,
              "the restarted server restored nothing:\n" + self.server_text())

    def stop_server(self):
        """SIGTERM: the server stops as an operator stops it (writing its --trace)."""
        self.server.send_signal(signal.SIGTERM)
        check(self.server.wait(timeout=30) == 0, "psched-server did not stop cleanly:\n" +
              self.server_text())

    def python_env(self, **extra):
        """The environment of a Python trainer of this job."""
        return dict(os.environ, PYTHONPATH=os.path.join(self.build, "python"),
                    PSCHED_CONFIG=self.config, **extra)

    def server_text(self):
        return open(self.server_log).read()

    def log(self, name):
        return os.path.join(self.work, name + ".log")

    def start(self, worker, command, name, env=None, stdin=None):
        self.workers[worker] = subprocess.Popen(
            command, stdout=open(self.log(name), "w"), stderr=subprocess.STDOUT, env=env,
            stdin=stdin)

    def text(self, name):
        return open(self.log(name)).read()

    def kill(self, worker):
        self.workers[worker].send_signal(signal.SIGKILL)
        self.workers[worker].wait()

    def wait_all(self, names, timeout=300):
        deadline = time.time() + timeout
        for worker, process in self.workers.items():
            try:
                code = process.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                fail(f"worker {worker} did not finish:\n" + self.text(names[worker]))
            check(code == 0, f"worker {worker} exited {code}:\n" + self.text(names[worker]))

    def get(self, path, shard):
        with urllib.request.urlopen(f"http://127.0.0.1:{HTTP[shard]}{path}", timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        for process in list(self.workers.values()) + [self.server]:
            if process and process.poll() is None:
                process.kill()
                process.wait()

    def dump_logs(self):
        print("--- server log\n" + self.server_text())
        for name in sorted(os.listdir(self.work)):
            if name.endswith(".log") and name != "server.log":
                print(f"--- {name}\n" + open(os.path.join(self.work, name)).read())

    def __enter__(self):
        return self

    def __exit__(self, failure, *_):
        """Prints the logs when the test failed, then stops every process and removes the
        folder."""
        if failure is not None:
            self.dump_logs()
        self.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def last_step(text):
    steps = re.findall(r"^step (\d+)$", text, re.M)
    return int(steps[-1]) if steps else 0


def replay(records, workers, steps):
    """The variables after `steps` steps of SGD (lr 1) in float32, each range of each step
    averaging the gradients (tests/member_client.cc's) of the workers `records` name for it,
    else of all `workers`, in the shard's arithmetic: the exact integer sum times 1/k."""
    short = {}  # (variable index, step) -> [(begin, end, workers)]
    for r in records:
        short.setdefault((int(r["variable"][1:]), r["step"]), []).append(
            (r["begin"], r["end"], r["workers"]))
    values = []
    for v, n in enumerate(ELEMENTS):
        i = np.arange(n, dtype=np.int64)
        w = np.zeros(n, dtype=np.float32)
        for s in range(1, steps + 1):
            gave = np.ones((workers, n), dtype=bool)
            for begin, end, who in short.get((v, s), []):
                for g in range(workers):
                    gave[g, begin:end] = g in who
            grads = np.stack([((g * 7 + v * 11 + s * 31 + i * 3) % 9 - 4) for g in range(workers)])
            total = (grads * gave).sum(axis=0).astype(np.float32)  # small integers: exact
            scale = np.float32(1) / gave.sum(axis=0).astype(np.float32)
            w = w - total * scale
        values.append(w)
    return np.concatenate(values)


def shard_requests(trace_file):
    """From psched-server's --trace: per shard, the time each worker's pushes of each variable
    and step had all arrived, {(worker, variable, step): time}, and each poll as (worker,
    variable, step, time its value was ready), in microseconds of CLOCK_MONOTONIC. A request is
    three slices in a row: the whole, then its two phases (server/shard_trace.h); the first
    phase ends when the push's last byte arrived or the poll's value was ready."""
    with open(trace_file) as f:
        events = json.load(f)["traceEvents"]
    workers, arrived, polls = {}, {}, {}  # (pid, tid) -> worker from the tracks' names
    for i, e in enumerate(events):
        if e.get("ph") == "M" and e["name"] == "thread_name":
            workers[e["pid"], e["tid"]] = int(e["args"]["name"].split()[1])
        if e.get("ph") != "X" or "step" not in (e.get("args") or {}):
            continue
        kind, phase = e["name"].split()[0], events[i + 1]
        check(phase["name"] == {"push": "receive", "poll": "wait"}[kind],
              f"trace: {e['name']} is followed by {phase['name']}")
        key = (workers[e["pid"], e["tid"]], e["args"]["variable"], e["args"]["step"])
        at = phase["ts"] + phase["dur"]
        if kind == "push":
            shard = arrived.setdefault(e["pid"], {})
            shard[key] = max(shard.get(key, at), at)
        else:
            polls.setdefault(e["pid"], []).append(key + (at,))
    return arrived, polls


def check_bound_from_trace(trace_file, members, k):
    """No poll for step s answered before every member's pushes of step s - k of that variable
    had arrived at its shard; returns the furthest a poller was ahead of another member."""
    arrived, polls = shard_requests(trace_file)
    check(polls, "the trace holds no polls")
    lead = 0
    for shard, answered in polls.items():
        # Per (member, variable): the times by which steps 1, 2, ... had all arrived.
        by_step = {}
        for (w, v, s), t in sorted(arrived[shard].items(), key=lambda item: item[0][2]):
            times = by_step.setdefault((w, v), [])
            check(s == len(times) + 1, f"shard {shard}: worker {w} pushed v{v} step {s} "
                  f"after {len(times)} steps")
            times.append(max(t, times[-1]) if times else t)
        for w, v, s, ready in answered:
            for other in members:
                times = by_step.get((other, v), [])
                done = bisect.bisect_right(times, ready + 1e-3)  # steps arrived by then
                check(s <= k or done >= s - k,
                      f"shard {shard}: worker {w}'s poll of v{v} for step {s} was answered "
                      f"when worker {other} had pushed only {done} steps of it (k = {k})")
                lead = max(lead, s - done)
    return lead


def test_staleness(build, k=2):
    with Job(build, "staleness", 4, f"staleness: {k}\n", mode="bounded") as job:
        names = {w: f"worker{w}" for w in range(4)}
        trace_file = os.path.join(job.work, "trace.json")
        job.start_server("--trace", trace_file)
        for w in range(4):
            job.start(w, member_command(job, w, 5) + ["--slow-every", "4", "--slow-ms", "30"],
                      names[w])
        job.wait_all(names)
        held = sum(job.get("/status", shard)["membership"]["polls_held"] for shard in (0, 1))
        # Negated as integers: a zero sum is +0.0 on the shard (x - x), not -0.0.
        expected = np.concatenate([
            (-sum(((g * 7 + v * 11 + s * 31 + np.arange(n) * 3) % 9 - 4)
                  for g in range(4) for s in range(1, STEPS + 1))).astype(np.float32)
            for v, n in enumerate(ELEMENTS)]).tobytes()
        # The shards' values once every worker is done: worker 0 again, as a restarted process,
        # starts after step STEPS, pushes nothing and fetches them.
        again = subprocess.run(member_command(job, 0, 0), capture_output=True, text=True)
        check(again.returncode == 0 and f"start step {STEPS + 1}" in again.stdout,
              "worker 0 started again:\n" + again.stdout + again.stderr)
        with open(os.path.join(job.work, "values0.bin"), "rb") as f:
            check(f.read() == expected, "the shards' values differ from the exact sum")
        job.stop_server()
        lead = check_bound_from_trace(trace_file, range(4), k)
        check(lead >= 1, "no poll was ever answered ahead of another worker's pushes: the bound "
              "was never tested")
        print(f"staleness: 4 workers, k = {k}, a moving straggler, {STEPS} steps: in the shards' "
              f"trace no poll for step s was answered before every worker's pushes of step "
              f"s - {k} had arrived; the furthest a poll ran ahead of another worker: {lead} "
              f"steps; {held} polls held; final values equal the exact sum of every gradient")


def member_command(job, worker, compute_ms):
    return [os.path.join(job.build, "tests", "psched-member-client"), "--config", job.config,
            "--worker", str(worker), "--steps", str(STEPS), "--compute-ms", str(compute_ms),
            "--dump", os.path.join(job.work, f"values{worker}.bin")]


def test_members(build, restart_server):
    extra = "checkpoint: {directory: state, interval_seconds: 0}\n" if restart_server else ""
    with Job(build, "members", 4, extra) as job:
        names = {w: f"worker{w}" for w in range(4)}
        job.start_server()
        for w in range(4):
            job.start(w, member_command(job, w, 10), names[w])
        wait_until(lambda: last_step(job.text("worker3")) >= 60, "worker 3 to reach step 60")
        job.kill(3)
        killed = time.time()
        killed_at = last_step(job.text("worker3"))
        others = lambda: min(last_step(job.text(f"worker{w}")) for w in range(3))
        stalled_at = others()
        wait_until(lambda: "worker 3 left the job" in job.server_text(), "worker 3's lease to end")
        wait_until(lambda: others() >= stalled_at + 10, "the others to go on without worker 3")
        went_on = time.time() - killed
        if restart_server:
            job.restart_server()
        names[3] = "worker3-rejoined"
        job.start(3, member_command(job, 3, 10), names[3])
        if restart_server:
            wait_until(lambda: "start step" in job.text(names[3]), "the new worker 3 to join")
            job.restart_server()
        job.wait_all(names)
        rejoined = job.text(names[3])
        start = int(re.search(r"start step (\d+)", rejoined).group(1))
        check(start > killed_at, f"the new worker 3 started at step {start}, before the old one "
              f"was killed ({killed_at})")
        records = job.get("/membership", 0)["short_handed"] + \
            job.get("/membership", 1)["short_handed"]
        check(records, "no step was recorded short-handed")
        for shard in (0, 1):
            membership = job.get("/status", shard)["membership"]
            check(membership["members"] == 4 and membership["leaves"] >= 1 and
                  membership["joins"] >= 1, f"shard {shard}'s membership: {membership}")
        status = subprocess.run([os.path.join(build, "apps", "psched"), "status", "--config",
                                 job.config], capture_output=True, text=True)
        check(status.returncode == 0 and
              re.search(r"shard 0: members 0 1 2 3 \(from steps 1 1 1 \d+\), joins \d+, "
                        r"leaves \d+", status.stdout), "psched status:\n" + status.stdout)
        expected = replay(records, 4, STEPS).tobytes()
        for w in range(4):
            with open(os.path.join(job.work, f"values{w}.bin"), "rb") as f:
                check(f.read() == expected, f"worker {w}'s values differ from the replay of the "
                      "recorded membership")
        print(f"{'restart' if restart_server else 'members'}: worker 3 killed at step "
              f"{killed_at}; the others went on {went_on:.1f} s after the kill (lease 2 s); "
              f"the new worker 3 started at step {start}; {len(records)} ranges applied "
              "short-handed; final values equal the replay of the recorded membership")


def digits_example(source):
    return os.path.join(source, "python", "examples", "train_digits.py")


def epochs(text):
    return [(int(e), float(a)) for e, a in
            re.findall(r"epoch +(\d+) +loss \S+ +test accuracy (\S+)", text)]


# Runs the script in argv[1] with the arguments after it once a line arrives on stdin, with
# torch, scikit-learn and psched imported before.
LATER = ("import runpy, sys, torch, sklearn.datasets, psched.torch; sys.stdin.readline(); "
         "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def test_digits(build, source):
    with Job(build, "digits", 3, lease=3) as job:
        env = job.python_env(WORLD_SIZE="3")
        example = digits_example(source)
        command = ["/usr/bin/python3", example, "--epochs", "40", "--batch", "8"]
        names = {w: f"worker{w}" for w in range(3)}
        job.start_server()
        for w in range(3):
            job.start(w, command, names[w], dict(env, RANK=str(w)))
        wait_until(lambda: len(epochs(job.text("worker2"))) >= 2, "worker 2's second epoch")
        job.kill(2)
        killed = time.time()
        names[2] = "worker2-rejoined"
        job.start(2, ["/usr/bin/python3", "-c", LATER] + command[1:], names[2],
                  dict(env, RANK="2"), stdin=subprocess.PIPE)
        before = min(len(epochs(job.text(f"worker{w}"))) for w in (0, 1))
        wait_until(lambda: min(len(epochs(job.text(f"worker{w}"))) for w in (0, 1)) >= before + 2,
                   "the other two to finish two more epochs")
        went_on = time.time() - killed
        job.workers[2].stdin.write(b"go\n")
        job.workers[2].stdin.close()
        job.wait_all(names)
        rejoined = job.text(names[2])
        joined = re.search(r"joins the job at step (\d+) \(epoch (\d+)\)", rejoined)
        check(joined, "the new worker 2 did not say where it joined:\n" + rejoined)
        first = int(joined.group(2))
        printed = [e for e, _ in epochs(rejoined)]
        check(printed == list(range(first, 41)) and 2 < first <= 40,
              f"the new worker 2 printed epochs {printed}, joining at epoch {first}")
        finals = [epochs(job.text(names[w]))[-1] for w in range(3)]
        check(all(e == 40 for e, _ in finals), f"not every worker ended at epoch 40: {finals}")
        accuracies = {a for _, a in finals}
        check(len(accuracies) == 1 and min(accuracies) >= 0.9,
              f"final test accuracies {finals}: expected one value of at least 0.9")
        print(f"digits: worker 2 killed after epoch 2; the others finished two more epochs "
              f"{went_on:.1f} s later (lease 3 s); the new worker 2 joined at step "
              f"{joined.group(1)} (epoch {first}); all three ended at test accuracy "
              f"{accuracies.pop():.3f}")


def final_accuracy(build, source, mode):
    """The test accuracy the digits example's three workers end with in `mode`."""
    extra = "staleness: 2\n" if mode == "bounded" else ""
    with Job(build, "digits_" + mode, 3, extra, mode) as job:
        env = job.python_env(WORLD_SIZE="3")
        example = digits_example(source)
        names = {w: f"worker{w}" for w in range(3)}
        job.start_server()
        for w in range(3):
            job.start(w, ["/usr/bin/python3", example, "--epochs", "40", "--batch", "8"],
                      names[w], dict(env, RANK=str(w)))
        job.wait_all(names)
        finals = [epochs(job.text(names[w]))[-1] for w in range(3)]
        check(all(e == 40 for e, _ in finals), f"{mode}: not every worker ended at epoch 40")
        return max(a for _, a in finals)


def test_bounded(build, source):
    sync, bounded = (final_accuracy(build, source, mode) for mode in ("sync", "bounded"))
    # Bounded mode has to reach sync's accuracy within one point; ending above it is fine.
    check(min(sync, bounded) >= 0.9 and bounded >= sync - 0.01,
          f"test accuracy {bounded:.3f} in bounded mode, {sync:.3f} in sync mode")
    print(f"bounded: digits, 3 workers, 40 epochs: test accuracy {bounded:.3f} in bounded mode "
          f"(staleness 2), {sync:.3f} in sync mode")


def parent_of(pid):
    """The parent's id of process `pid`, from /proc/PID/stat (no procps on a minimal machine);
    None when it is gone. Its second field, the command name in parentheses, may itself hold
    spaces and parentheses: the fields after it follow the last ')'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root):
    """The ids of the processes below `root` (its children, theirs, ...), not `root` itself:
    only what this test started, never another test's process on the same machine."""
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        parent = parent_of(pid)
        if parent is not None:
            children.setdefault(parent, []).append(int(pid))
    found, pending = [], list(children.get(root, []))
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def descendant_running(root, script, variable):
    """The id of a process below `root` running `script` with `variable` ("NAME=value") in
    its environment; None when there is none."""
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if script.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if variable in f.read().split(b"\0"):
                    return pid
        except OSError:  # gone meanwhile
            continue
    return None


def test_torchrun(build, source):
    with Job(build, "torchrun", 3) as job:
        env = job.python_env()
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        example = digits_example(source)
        # --redirects/--tee 1: Debian's torch 1.13 under Python 3.11 cannot parse the default 0
        # (Std.NONE is not among an IntFlag's members there), so stdout goes through its logs.
        command = ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "3", "--max_restarts", "2", "--monitor_interval", "1",
                   "--redirects", "1", "--tee", "1",
                   "--log_dir", os.path.join(job.work, "torchrun"),
                   example, "--epochs", "40", "--batch", "8"]
        job.start_server()
        job.start("agent", command, "torchrun", env)
        wait_until(lambda: "worker 2 epoch  2" in job.text("torchrun"), "worker 2's second epoch")
        # Only the agent's own workers: another test may run the example as RANK=2 meanwhile.
        victim = descendant_running(job.workers["agent"].pid, example, b"RANK=2")
        check(victim, "no RANK=2 process found below the torchrun agent")
        os.kill(victim, signal.SIGKILL)
        job.wait_all({"agent": "torchrun"})
        log = job.text("torchrun")
        joins = re.findall(r"worker (\d) joins the job at step (\d+)", log)
        check(sorted(w for w, _ in joins) == ["0", "1", "2"],
              f"not every restarted process rejoined: {joins}")
        finals = {}
        for w in range(3):
            mine = re.findall(rf"worker {w} epoch +(\d+) +loss (\S+) +test accuracy (\S+)", log)
            check(mine and mine[-1][0] == "40", f"worker {w} did not reach epoch 40")
            check(float(mine[-1][1]) < float(mine[0][1]), f"worker {w}'s loss did not fall")
            finals[w] = mine[-1][2]
        check(len(set(finals.values())) == 1 and float(finals[0]) >= 0.9,
              f"final test accuracies {finals}")
        print(f"torchrun: RANK=2 killed after epoch 2; the agent restarted the group; the new "
              f"processes rejoined at steps {[int(s) for _, s in joins]}; all ended at epoch 40, "
              f"test accuracy {finals[0]}")


def main():
    scenario, build, source = sys.argv[1:4]
    if scenario == "members":
        test_members(build, restart_server=False)
    elif scenario == "restart":
        test_members(build, restart_server=True)
    elif scenario == "digits":
        test_digits(build, source)
    elif scenario == "bounded":
        test_bounded(build, source)
    elif scenario == "torchrun":
        test_torchrun(build, source)
    elif scenario == "staleness":
        test_staleness(build)
    else:
        fail(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
