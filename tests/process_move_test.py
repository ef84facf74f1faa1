#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Shards moving between server processes while two sync example trainers train (a deployment
file with servers:, psched-server --server NAME, psched shards add|remove):

  4 shards (the model split over all of them) on servers a and b. Near step 100 server c starts
  on another address (127.0.0.2, another node as far as the shards' addresses go) and
  `psched shards add` gives it one shard; c is SIGKILLed as soon as the file says so (while it
  restores the shard, or just after) and started again. Near step 250 `psched shards remove`
  moves a's other shard to c and a is SIGKILLed at once (while it lets the shard go). The
  trainers follow the shards to their new addresses and end bit-equal to the run on a and b
  throughout; a and b's shards never were served by two processes at once.

`psched status` then prints what each server hosts. Also refused, naming why, with the file
unchanged: `shards add` of a server that does not answer; a second psched-server started for a
shard another process hosts.

Usage: process_move_test.py BUILD_DIR
Standard library only.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request

from free_ports import free_ports
from process_checks import check, fail, wait_until

STEPS = 1500
LISTEN = free_ports(4)
CONTROL = free_ports(3)
SPARE = free_ports(1)[0]  # nothing answers here
NEW_HOST = "127.0.0.2"  # server c's node


def config_text(placement):
    """placement: shard -> (server, host); servers a, b on 127.0.0.1, c on NEW_HOST."""
    used = sorted({server for server, _ in placement})
    hosts = {"a": "127.0.0.1", "b": "127.0.0.1", "c": NEW_HOST}
    text = ("mode: sync\nworkers: 2\nsplit_bytes: 64\n"
            "optimizer: {kind: adam, lr: 0.05}\nreconnect: {timeout_seconds: 60}\n"
            "checkpoint: {directory: state, interval_seconds: 0.5}\nservers:\n")
    for name in used:
        text += f"  - {{name: {name}, control: '{hosts[name]}:{CONTROL['abc'.index(name)]}'}}\n"
    if "PSCHED_TEST_DATA_PATH" in os.environ:  # ctest runs it over both data paths
        text += f"data_path: {os.environ['PSCHED_TEST_DATA_PATH']}\n"
    text += "shards:\n"
    for shard, (server, host) in enumerate(placement):
        text += (f"  - {{listen: '{host}:{LISTEN[shard]}', http: '{host}:{LISTEN[shard] + 1000}', "
                 f"server: {server}}}\n")
    return text


START = [("a", "127.0.0.1"), ("a", "127.0.0.1"), ("b", "127.0.0.1"), ("b", "127.0.0.1")]


class Job:
    def __init__(self, build, name):
        self.build = build
        self.work = tempfile.mkdtemp(prefix=f"psched_{name}_")
        self.config = os.path.join(self.work, "job.yaml")
        with open(self.config, "w") as f:
            f.write(config_text(START))
        self.servers = {}
        self.trainers = {}

    def log(self, name):
        path = os.path.join(self.work, f"{name}.log")
        return open(path).read() if os.path.exists(path) else ""

    def start_server(self, name, *flags):
        log = open(os.path.join(self.work, f"server_{name}.log"), "a")
        self.servers[name] = subprocess.Popen(
            [os.path.join(self.build, "apps", "psched-server"), "--config", self.config,
             "--server", name, "--threads", "2", "--apply-threads", "0", *flags], stderr=log)

    def hosted(self, name):
        host = NEW_HOST if name == "c" else "127.0.0.1"
        try:
            with urllib.request.urlopen(
                    f"http://{host}:{CONTROL['abc'.index(name)]}/server", timeout=5) as r:
                return json.load(r)["hosted"]
        except OSError:
            return None

    def start_trainer(self, worker):
        log = open(os.path.join(self.work, f"trainer{worker}.log"), "w")
        self.trainers[worker] = subprocess.Popen(
            [os.path.join(self.build, "apps", "psched-example-trainer"), "--config", self.config,
             "--worker", str(worker), "--steps", str(STEPS), "--print-every", "10",
             "--dump", os.path.join(self.work, f"params{worker}.txt")],
            stdout=log, stderr=subprocess.STDOUT)

    def step(self, worker):
        steps = re.findall(r"step +(\d+) ", self.log(f"trainer{worker}"))
        return int(steps[-1]) if steps else 0

    def shards(self, *args):
        return subprocess.run([os.path.join(self.build, "apps", "psched"), "shards", *args,
                               "--config", self.config], capture_output=True, text=True,
                              timeout=180)

    def train(self, during=lambda: None):
        """Starts a and b and the trainers, calls during(), waits; worker 0's parameters."""
        self.start_server("a")
        self.start_server("b")
        wait_until(lambda: self.hosted("a") == [0, 1] and self.hosted("b") == [2, 3],
                   "servers a and b to host their shards")
        for w in (0, 1):
            self.start_trainer(w)
        during()
        for w, process in self.trainers.items():
            try:
                process.wait(timeout=300)
            except subprocess.TimeoutExpired:
                fail(f"trainer {w} did not finish")
            check(process.returncode == 0, f"trainer {w} failed:\n" + self.log(f"trainer{w}"))
        params = [open(os.path.join(self.work, f"params{w}.txt")).read() for w in (0, 1)]
        check(params[0] == params[1], "sync workers ended with different parameters")
        return params[0]

    def dump_logs(self):
        for name in sorted(os.listdir(self.work)):
            if name.endswith(".log"):
                print(f"--- {name}\n" + self.log(name[:-4]))

    def cleanup(self):
        for process in list(self.trainers.values()) + list(self.servers.values()):
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def refusals(job):
    """What is refused while the job runs on a and b, the file left as it was."""
    before = open(job.config).read()
    spare = job.shards("add", "--server", "d", "--control", f"127.0.0.1:{SPARE}")
    check(spare.returncode == 2 and "server d does not answer" in spare.stderr,
          f"shards add of a server that is not there: {spare.returncode} {spare.stderr}")
    check(open(job.config).read() == before, "a refused shards add changed the file")
    plain = os.path.join(job.work, "plain.yaml")
    with open(plain, "w") as f:
        f.write(f"shards:\n  - {{listen: '127.0.0.1:{SPARE}'}}\n"
                "checkpoint: {directory: state}\n")
    second = subprocess.run([os.path.join(job.build, "apps", "psched-server"), "--config", plain],
                            capture_output=True, text=True, timeout=60)
    check(second.returncode == 2 and "shard 0 is hosted by another process (pid "
          f"{job.servers['a'].pid} on" in second.stderr,
          f"a second server for shard 0 was not refused naming a: {second.stderr}")


def moves(job):
    refusals(job)
    wait_until(lambda: job.step(0) >= 100, "trainer 0 to reach step 100", timeout=240)
    job.start_server("c", "--control", f"{NEW_HOST}:{CONTROL[2]}")  # not in the file yet
    wait_until(lambda: job.hosted("c") == [], "server c to answer")
    added = job.shards("add", "--server", "c", "--control", f"{NEW_HOST}:{CONTROL[2]}",
                       "--wait", "0")
    job.servers["c"].send_signal(signal.SIGKILL)  # in the middle of taking its shard
    job.servers["c"].wait()
    check("shard 1: server a -> c" in added.stdout, "shards add: " + added.stdout + added.stderr)
    added_at = job.step(0)
    job.start_server("c")
    wait_until(lambda: job.hosted("c") == [1], "server c to host shard 1")
    wait_until(lambda: job.step(0) >= 250, "trainer 0 to reach step 250", timeout=240)
    removed = job.shards("remove", "--server", "a", "--wait", "0")
    job.servers["a"].send_signal(signal.SIGKILL)  # while it lets its shard go
    job.servers["a"].wait()
    check(removed.returncode in (0, 1) and "shard 0: server a -> c" in removed.stdout,
          "shards remove: " + removed.stdout + removed.stderr)
    wait_until(lambda: job.hosted("c") == [1, 0], "server c to host shard 0")
    status = subprocess.run([os.path.join(job.build, "apps", "psched"), "status", "--config",
                             job.config], capture_output=True, text=True, timeout=60)
    check(status.returncode == 0 and
          f"server c ({NEW_HOST}:{CONTROL[2]}): hosts 1 0" in status.stdout and
          f"server b (127.0.0.1:{CONTROL[1]}): hosts 2 3" in status.stdout and
          "server a" not in status.stdout,
          f"psched status: {status.returncode}\n{status.stdout}{status.stderr}")
    print(f"move: shard 1 to server c near step {added_at} (c SIGKILLed and restarted), "
          f"shard 0 to c near step {job.step(0)} (a SIGKILLed)")


def main():
    build = sys.argv[1]
    reference_job = Job(build, "move_reference")
    try:
        reference = reference_job.train()
    except Exception:
        reference_job.dump_logs()
        raise
    finally:
        reference_job.cleanup()
    job = Job(build, "move")
    try:
        params = job.train(lambda: moves(job))
        for w in (0, 1):
            text = job.log(f"trainer{w}")
            check(f"shard 1 is now at {NEW_HOST}:{LISTEN[1]}" in text and
                  f"shard 0 is now at {NEW_HOST}:{LISTEN[0]}" in text,
                  f"trainer {w} did not follow the shards to {NEW_HOST}:\n" + text)
        check(params == reference, "parameters after the moves differ from the run without them")
        print("move: the trainers followed both shards; their parameters equal the reference")
    except Exception:
        job.dump_logs()
        raise
    finally:
        job.cleanup()


if __name__ == "__main__":
    main()
