#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Faults against real processes on loopback, each bounded in time:

  kill     psched-server is killed (SIGKILL) while two sync-mode example trainers push, then
           restarted on the same checkpoint directory: the trainers reconnect by themselves and
           their final parameters equal, bit for bit, those of a run without the kill.
  soak     two sync trainers reach the shards through a proxy that cuts random connections:
           the shards accept exactly the pushed bytes once (psched_shard_received_bytes_total),
           count the resent ones as duplicates, and the parameters equal the run without cuts.
  deadworker  a sync trainer is killed; with sync.on_timeout: fail the other one stops with a
           [sync_timeout] error naming it; with proceed it trains to the end.
  move     each shard in a process of its own; shard 0's is killed and comes back at another
           port (another node), the deployment files edited to say so, shard 1's left running:
           the trainers read their file again as they reconnect, follow shard 0 there, end
           bit-equal to the run without it, and a trainer started afterwards connects.

Usage: process_fault_test.py kill|soak|deadworker|move BUILD_DIR SOURCE_DIR
Standard library only.
"""
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from free_ports import free_ports
from process_checks import check, fail, wait_until

PORTS = free_ports(8)
LISTEN, HTTP, PROXY = PORTS[:2], PORTS[2:4], PORTS[4:6]  # the proxy forwards PROXY to LISTEN
MOVED = PORTS[6:]  # where test_move's shards come back
STEPS = 400
FEATURES = 64


def config_text(extra, ports=LISTEN):
    text = "mode: sync\nworkers: 2\nshards:\n"
    for listen, http in zip(ports, HTTP):
        text += f"  - {{listen: 127.0.0.1:{listen}, http: 127.0.0.1:{http}}}\n"
    text += "optimizer: {kind: adam, lr: 0.05}\nreconnect: {timeout_seconds: 30}\n"
    if "PSCHED_TEST_DATA_PATH" in os.environ:  # ctest runs some faults over both data paths
        text += f"data_path: {os.environ['PSCHED_TEST_DATA_PATH']}\n"
    return text + extra


class Job:
    """A deployment in a temp dir: its server, its trainers and their logs."""

    def __init__(self, build, name, extra="", trainer_ports=LISTEN):
        self.build = build
        self.work = tempfile.mkdtemp(prefix=f"psched_{name}_")
        self.config = self.write("server.yaml", config_text(extra))
        self.trainer_config = self.write("trainer.yaml", config_text(extra, trainer_ports))
        self.server = None
        self.server_log = os.path.join(self.work, "server.log")
        self.trainers = {}

    def write(self, name, text):
        path = os.path.join(self.work, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def start_server(self):
        log = open(self.server_log, "a")
        start = os.path.getsize(self.server_log)
        self.server = subprocess.Popen(
            [os.path.join(self.build, "apps", "psched-server"), "--config", self.config],
            stderr=log)
        for _ in range(600):
            text = open(self.server_log).read()[start:]
            if text.count("listening on") == 2:
                return
            if self.server.poll() is not None:
                fail("psched-server exited:\n" + text)
            time.sleep(0.05)
        fail("psched-server did not start:\n" + text)

    def start_trainer(self, worker, steps=STEPS, print_every=10):
        log = open(os.path.join(self.work, f"trainer{worker}.log"), "w")
        self.trainers[worker] = subprocess.Popen(
            [os.path.join(self.build, "apps", "psched-example-trainer"),
             "--config", self.trainer_config, "--worker", str(worker), "--steps", str(steps),
             "--print-every", str(print_every), "--dump", self.dump_file(worker)],
            stdout=log, stderr=subprocess.STDOUT)

    def dump_file(self, worker):
        return os.path.join(self.work, f"params{worker}.txt")

    def trainer_log(self, worker):
        return open(os.path.join(self.work, f"trainer{worker}.log")).read()

    def step_reached(self, worker):
        steps = re.findall(r"step +(\d+) ", self.trainer_log(worker))
        return int(steps[-1]) if steps else 0

    def wait_trainers(self, timeout=240):
        deadline = time.time() + timeout
        for worker, process in self.trainers.items():
            try:
                process.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.dump_logs()
                fail(f"trainer {worker} did not finish")

    def params(self, worker):
        with open(self.dump_file(worker)) as f:
            return f.read()

    def metric(self, name):
        total = 0.0
        for port in HTTP:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            for line in text.decode().splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        for process in list(self.trainers.values()) + [self.server]:
            if process and process.poll() is None:
                process.kill()
                process.wait()

    def dump_logs(self):
        print("--- server log\n" + open(self.server_log).read())
        for worker in self.trainers:
            print(f"--- trainer {worker}\n" + self.trainer_log(worker))

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def run_clean(build, name):
    """The reference: both trainers to the end, no faults. Returns worker 0's parameters."""
    job = Job(build, name + "_reference")
    try:
        job.start_server()
        for w in (0, 1):
            job.start_trainer(w)
        job.wait_trainers()
        for w in (0, 1):
            check(job.trainers[w].returncode == 0, f"reference trainer {w} failed:\n" +
                  job.trainer_log(w))
        check(job.params(0) == job.params(1), "sync workers ended with different parameters")
        return job.params(0)
    finally:
        job.cleanup()


def test_kill(build):
    reference = run_clean(build, "kill")
    job = Job(build, "kill", "checkpoint: {directory: state, interval_seconds: 0.2}\n")
    try:
        job.start_server()
        for w in (0, 1):
            job.start_trainer(w)
        wait_until(lambda: job.step_reached(0) >= 100, "trainer 0 to reach step 100")
        job.server.send_signal(signal.SIGKILL)
        job.server.wait()
        killed_at = job.step_reached(0)
        job.start_server()
        job.wait_trainers()
        for w in (0, 1):
            check(job.trainers[w].returncode == 0,
                  f"trainer {w} did not survive the restart:\n" + job.trainer_log(w))
            check("reconnected" in job.trainer_log(w), f"trainer {w} never reconnected")
        log = open(job.server_log).read()
        check("restored 2 variable part(s)" in log or "restored 1 variable part(s)" in log,
              "the restarted server did not say what it restored:\n" + log)
        check(job.params(0) == reference,
              "parameters after a SIGKILL and restart differ from the run without it")
        print(f"kill: server killed near step {killed_at}; "
              f"{re.findall(r'restored .*', log)}; final parameters equal the reference")
        job.server.send_signal(signal.SIGTERM)
        job.server.wait(timeout=30)
    except Exception:
        job.dump_logs()
        raise
    finally:
        job.cleanup()


def test_move(build):
    """Each shard in a process of its own; the one holding the variables (shard 0) SIGKILLed
    and started on another port from the same folder, both deployment files edited, shard 1's
    process left running with the old list: the trainers follow shard 0 and end bit-equal to
    the run without the move, and a trainer started afterwards connects to the two processes,
    whose shard lists now differ."""
    reference = run_clean(build, "move")
    extra = "checkpoint: {directory: state, interval_seconds: 0.2}\n"
    job = Job(build, "move", extra)
    server = os.path.join(job.build, "apps", "psched-server")
    log = open(job.server_log, "a")

    def start(shard):
        process = subprocess.Popen([server, "--config", job.config, "--shard", str(shard)],
                                   stderr=log)
        wait_until(lambda: open(job.server_log).read().count("listening on") >= started[0] + 1,
                   f"shard {shard} to listen")
        started[0] += 1
        return process

    started = [0]
    shards = [start(0), start(1)]
    try:
        for w in (0, 1):
            job.start_trainer(w)
        wait_until(lambda: job.step_reached(0) >= 100, "trainer 0 to reach step 100")
        shards[0].send_signal(signal.SIGKILL)
        shards[0].wait()
        moved_at = job.step_reached(0)
        moved = [MOVED[0], LISTEN[1]]  # an operator moving shard 0 to another node
        job.write("server.yaml", config_text(extra, moved))
        job.write("trainer.yaml", config_text(extra, moved))
        shards[0] = start(0)
        job.wait_trainers()
        for w in (0, 1):
            text = job.trainer_log(w)
            check(job.trainers[w].returncode == 0,
                  f"trainer {w} did not survive the move:\n" + text)
            check(f"shard 0 is now at 127.0.0.1:{MOVED[0]}" in text and
                  f"reconnected to shard 127.0.0.1:{MOVED[0]}" in text,
                  f"trainer {w} did not follow shard 0 to port {MOVED[0]}:\n" + text)
        check(job.params(0) == reference,
              "parameters after the move differ from the run without it")
        job.start_trainer(0)  # a restarted trainer: joins after the last step, and stops
        job.wait_trainers()
        check(job.trainers[0].returncode == 0,
              "a trainer started after the move was refused:\n" + job.trainer_log(0))
        print(f"move: shard 0 moved near step {moved_at} to port {MOVED[0]}; the trainers "
              "followed it, their parameters equal the reference, and a trainer started "
              "afterwards connected")
    except Exception:
        job.dump_logs()
        raise
    finally:
        for process in shards:
            if process.poll() is None:
                process.kill()
                process.wait()
        job.cleanup()


class ChaosProxy:
    """Forwards each PROXY port to its shard; after every 20-60 KB it forwarded (either way, all
    connections together) it cuts a random open connection. Driven by the bytes, not the clock:
    the soak forwards at least its gradients up and its values down, so it cuts at least that
    many bytes over 60 KB times, however long the run takes (test_soak checks it)."""

    CUT_EVERY = (20_000, 60_000)  # bytes forwarded between two cuts

    def __init__(self, seed):
        self.random = random.Random(seed)
        self.pairs = []
        self.lock = threading.Lock()
        self.running = True
        self.cuts = 0
        self.forwarded = 0
        self.next_cut = self.random.uniform(*self.CUT_EVERY)
        self.listeners = []
        for front, back in zip(PROXY, LISTEN):
            listener = socket.create_server(("127.0.0.1", front))
            self.listeners.append(listener)
            threading.Thread(target=self.accept, args=(listener, back), daemon=True).start()

    def accept(self, listener, back):
        while self.running:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", back))
            with self.lock:
                self.pairs.append((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    def pump(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
                self.count(len(data))
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def count(self, forwarded):
        """Adds `forwarded` bytes; cuts a random open connection when the budget is spent."""
        with self.lock:
            self.forwarded += forwarded
            if self.forwarded < self.next_cut or not self.pairs or not self.running:
                return
            self.next_cut = self.forwarded + self.random.uniform(*self.CUT_EVERY)
            pair = self.pairs.pop(self.random.randrange(len(self.pairs)))
            self.cuts += 1
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self):
        self.running = False
        for listener in self.listeners:
            listener.close()


def test_soak(build):
    reference = run_clean(build, "soak")
    job = Job(build, "soak", trainer_ports=PROXY)
    proxy = ChaosProxy(seed=7)
    try:
        job.start_server()
        for w in (0, 1):
            job.start_trainer(w)
        job.wait_trainers()
        proxy.stop()
        for w in (0, 1):
            check(job.trainers[w].returncode == 0,
                  f"trainer {w} failed under random disconnects:\n" + job.trainer_log(w))
        reconnects = sum(job.trainer_log(w).count("reconnected to shard") for w in (0, 1))
        pushed_bytes = 2 * STEPS * (FEATURES + 1) * 4  # workers x steps x (w and b) floats
        received = job.metric("psched_shard_received_bytes_total")
        duplicates = job.metric("psched_shard_duplicate_pushes_total")
        print(f"soak: {proxy.forwarded} bytes forwarded, {proxy.cuts} connections cut, "
              f"{reconnects} reconnects, {pushed_bytes} bytes pushed, {received:.0f} accepted, "
              f"{duplicates:.0f} duplicate pushes acknowledged")
        # Gradients up and values down: at least twice the pushed bytes crossed the proxy, so
        # at least that over the largest budget of cuts happened, whatever the timing.
        least_cuts = 2 * pushed_bytes // ChaosProxy.CUT_EVERY[1]
        check(proxy.cuts >= least_cuts,
              f"{proxy.cuts} cuts after {proxy.forwarded} bytes: fewer than {least_cuts}")
        check(received == pushed_bytes,
              f"shards accepted {received:.0f} bytes of {pushed_bytes} pushed (lost or doubled)")
        check(job.params(0) == reference,
              "parameters under random disconnects differ from the run without them")
    except Exception:
        job.dump_logs()
        raise
    finally:
        proxy.stop()
        job.cleanup()


def test_dead_worker(build):
    # A step of the live pair takes milliseconds: 5 s leaves a stalled machine a wide margin
    # before a timeout that is not the dead worker's. Each step after the death costs it.
    for action in ("fail", "proceed"):
        job = Job(build, "dead_" + action, f"sync: {{timeout_seconds: 5, on_timeout: {action}}}\n")
        try:
            job.start_server()
            job.start_trainer(0, steps=100_000, print_every=1)
            job.start_trainer(1, steps=100_000, print_every=1)
            wait_until(lambda: job.step_reached(1) >= 20, "trainer 1 to reach step 20")
            job.trainers[1].kill()
            job.trainers[1].wait()
            if action == "fail":
                job.trainers[0].wait(timeout=60)
                log = job.trainer_log(0)
                check(job.trainers[0].returncode != 0 and "waited" in log and
                      "worker(s) 1" in log,
                      "the survivor did not stop with a sync timeout naming worker 1:\n" + log)
                print("deadworker fail: " + log.strip().splitlines()[-1])
            else:
                # Every step is logged once done, so worker 1 pushed at most two steps past its
                # last line: three past both lines, trainer 0 has trained a step without it.
                without = max(job.step_reached(0), job.step_reached(1)) + 3
                wait_until(lambda: job.step_reached(0) >= without,
                           "trainer 0 to go on without worker 1")
                timeouts = job.metric("psched_shard_sync_timeouts_total")
                check(timeouts >= 1, "no sync timeout counted")
                print(f"deadworker proceed: trainer 0 went on to step {job.step_reached(0)} "
                      f"(step {without} needed a step without worker 1); {timeouts:.0f} timed-out "
                      "steps counted")
        except Exception:
            job.dump_logs()
            raise
        finally:
            job.cleanup()


def main():
    test, build, _source = sys.argv[1:4]
    {"kill": test_kill, "soak": test_soak, "deadworker": test_dead_worker,
     "move": test_move}[test](build)


if __name__ == "__main__":
    main()
