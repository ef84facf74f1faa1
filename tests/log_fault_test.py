#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Update-log faults against a real psched-server on loopback. Each case checks what the shard
holds after a restart (psched-log-fault-client --check): every acknowledged update, or a
refusal to start that names the damaged or missing file.

  disk full    the log's disk fills mid-record (a 2 MiB tmpfs as root; otherwise a file size
               limit set on the server with prlimit); the push gets [io_error] naming the file;
               space comes back; training goes on; SIGKILL; the restart holds every step.
  damaged      a byte in the middle of the newest log: the start is refused naming the file and
               the byte; --accept-log-loss starts with fewer steps, saying so.
  missing      the newest log deleted: refused naming it; --accept-log-loss rolls back to the
               checkpoint.
  older        the newest checkpoint corrupt and a record of the previous log damaged: refused
               naming that log (not a step error).
  torn         the newest log cut inside its last record: dropped, the start goes on.
  not a dir    the checkpoint directory is a file: refused naming it.

A refused start exits 2 with the refusal, and tries no final checkpoint on its way out.

Usage: log_fault_test.py BUILD_DIR. Standard library only; every wait is bounded.
"""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from free_ports import free_ports
from process_checks import check

LISTEN, HTTP = free_ports(2)


class Shard:
    def __init__(self, build, work, state):
        self.build, self.work, self.state = build, work, state
        self.config = os.path.join(work, "server.yaml")
        with open(self.config, "w") as f:
            f.write(f"mode: async\nworkers: 1\nshards:\n"
                    f"  - {{listen: 127.0.0.1:{LISTEN}, http: 127.0.0.1:{HTTP}}}\n"
                    f"checkpoint: {{directory: {state}, interval_seconds: 0}}\n"
                    f"reconnect: {{timeout_seconds: 30}}\n")
        self.log_path = os.path.join(work, "server.log")
        self.process = None

    def log(self):
        return open(self.log_path).read()

    def start(self, *flags, expect_refusal=False):
        start = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        self.process = subprocess.Popen(
            [os.path.join(self.build, "apps", "psched-server"), "--config", self.config, *flags],
            stderr=open(self.log_path, "a"))
        for _ in range(600):
            text = self.log()[start:]
            if "listening on" in text:
                check(not expect_refusal, "the server started:\n" + text)
                return text
            if self.process.poll() is not None:
                text = self.log()[start:]  # all it wrote before it exited
                check(expect_refusal, "psched-server exited:\n" + text)
                check(self.process.returncode == 2,
                      f"a refused start exited {self.process.returncode}, not 2")
                # Nothing was restored, so there is nothing to checkpoint on the way out.
                check("final checkpoint failed" not in text,
                      "a refused start tried a final checkpoint:\n" + text)
                return text
            time.sleep(0.05)
        raise AssertionError("psched-server did not start or stop:\n" + self.log()[start:])

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)

    def client(self, *args, **kwargs):
        return subprocess.Popen(
            [os.path.join(self.build, "tests", "psched-log-fault-client"), "--config",
             self.config, *args], stdout=subprocess.PIPE, text=True, **kwargs)

    def push(self, steps):
        run = self.client("--steps", str(steps))
        out, _ = run.communicate(timeout=120)
        check(run.returncode == 0 and "done" in out, f"pushing {steps} steps failed:\n{out}")

    def holds(self, steps):
        run = self.client("--check", str(steps))
        out, _ = run.communicate(timeout=120)
        return run.returncode == 0, out.strip()

    def logs(self):
        return sorted(glob.glob(os.path.join(self.state, "shard-0.*.log")))

    def checkpoints(self):
        return sorted(glob.glob(os.path.join(self.state, "shard-0.*.ckpt")))


def flip_byte(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))


def case(build, name, body, tmpfs=False):
    work = tempfile.mkdtemp(prefix=f"psched_log_{name}_")
    state = os.path.join(work, "state")
    os.mkdir(state)
    if tmpfs:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", state], check=True)
    shard = Shard(build, work, state)
    try:
        body(shard)
        print(f"ok: {name}", flush=True)
    except Exception:
        print("--- server log\n" + (shard.log() if os.path.exists(shard.log_path) else ""))
        raise
    finally:
        if shard.process and shard.process.poll() is None:
            shard.process.kill()
            shard.process.wait()
        if tmpfs:
            subprocess.run(["umount", state], check=False)
        shutil.rmtree(work, ignore_errors=True)


def disk_full(shard, as_root):
    shard.start()
    client = shard.client("--steps", "40", stdin=subprocess.PIPE)
    log_file = shard.logs()[-1]
    filler = os.path.join(shard.state, "filler")
    for line in client.stdout:
        if line.startswith("acknowledged 10"):
            if as_root:  # fill the disk, then free 8 KiB: the next 32 KiB record is torn
                fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    while True:
                        os.write(fd, b"\0" * 4096)
                except OSError:
                    pass
                os.close(fd)
                os.truncate(filler, max(0, os.path.getsize(filler) - 8192))
            else:
                subprocess.run(["prlimit", f"--pid={shard.process.pid}",
                                f"--fsize={os.path.getsize(log_file) + 8192}:unlimited"], check=True)
        if line.startswith("io_error"):
            error = line
            reason = "No space left on device" if as_root else "File too large"
            check(log_file in line and reason in line, "the [io_error] names no file:\n" + line)
            if as_root:
                os.remove(filler)
            else:
                subprocess.run(["prlimit", f"--pid={shard.process.pid}", "--fsize=unlimited:unlimited"],
                               check=True)
            client.stdin.write("space again\n")
            client.stdin.flush()
        if line.startswith("done"):
            break
    client.wait(timeout=60)
    check(client.returncode == 0, "the client did not finish")
    check(f"writing update log {log_file} failed" in shard.log(),
          "the server did not log the failed write with the file name")
    shard.kill()
    text = shard.start()
    check("torn" not in text and "damaged" not in text, "the restart found damage:\n" + text)
    ok, said = shard.holds(40)
    check(ok, "after a full disk and a restart: " + said)
    print(f"disk full: {error.strip()[:160]}...; after SIGKILL and restart: {said}")


def damaged(shard):
    shard.start()
    shard.push(20)
    shard.kill()
    log_file = shard.logs()[-1]
    flip_byte(log_file, os.path.getsize(log_file) // 2)
    text = shard.start(expect_refusal=True)
    check(f"update log {log_file} is damaged at byte" in text and "--accept-log-loss" in text,
          "the refusal does not name the damaged log:\n" + text)
    text = shard.start("--accept-log-loss")
    check("GOING ON WITHOUT THEM" in text, "an accepted loss was not logged loudly:\n" + text)
    ok, said = shard.holds(20)
    check(not ok and "holds steps 1.." in said, "after an accepted loss: " + said)
    print("damaged: refused, then with --accept-log-loss: " + said)


def missing(shard):
    shard.start()
    shard.push(10)
    shard.stop()  # a clean stop: the checkpoint holds steps 1..10
    shard.start()
    shard.push(20)  # 1..10 acknowledged as duplicates, 11..20 logged
    shard.kill()
    log_file = shard.logs()[-1]
    os.remove(log_file)
    text = shard.start(expect_refusal=True)
    check(f"update log {log_file} is missing" in text, "the refusal does not name the log:\n" + text)
    shard.start("--accept-log-loss")
    ok, said = shard.holds(10)
    check(ok, "with --accept-log-loss the checkpoint was not restored: " + said)
    print("missing: refused, then with --accept-log-loss: " + said)


def older(shard):
    shard.start()
    shard.push(10)
    shard.kill()
    shard.start()  # replays log 1 into checkpoint 2
    shard.push(20)
    shard.kill()
    previous, newest = shard.logs()[-2], shard.checkpoints()[-1]
    flip_byte(newest, os.path.getsize(newest) - 5)
    flip_byte(previous, os.path.getsize(previous) // 2)
    text = shard.start(expect_refusal=True)
    check(f"update log {previous} is damaged" in text and "step_from_future" not in text,
          "the refusal does not name the damaged older log:\n" + text)
    print("older: " + [l for l in text.splitlines() if "damaged" in l][-1][:200])


def torn(shard):
    shard.start()
    shard.push(10)
    shard.kill()
    log_file = shard.logs()[-1]
    os.truncate(log_file, os.path.getsize(log_file) - 100)
    text = shard.start()
    check("dropped a torn last record" in text, "the torn record was not reported:\n" + text)
    ok, said = shard.holds(9)
    check(ok, "after a torn last record: " + said)


def not_a_directory(shard):
    os.rmdir(shard.state)
    open(shard.state, "w").close()
    text = shard.start(expect_refusal=True)
    check(f"checkpoint directory {shard.state} cannot be created" in text,
          "the refusal does not name the directory:\n" + text)
    print("not a dir: " + text.strip().splitlines()[-1].split("psched-server: ", 1)[-1])


def main():
    build = sys.argv[1]
    as_root = os.geteuid() == 0
    case(build, "disk_full", lambda s: disk_full(s, as_root), tmpfs=as_root)
    if not as_root:
        print("disk full tested with a file size limit (tmpfs needs root)")
    case(build, "damaged", damaged)
    case(build, "missing", missing)
    case(build, "older", older)
    case(build, "torn", torn)
    case(build, "not_a_directory", not_a_directory)
    print("all update-log faults checked")


if __name__ == "__main__":
    main()
