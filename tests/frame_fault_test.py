#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Frame faults against a real psched-server on loopback: garbage bytes, truncated and
stalled frames, oversized frames and too many connections. After each fault the shard still serves a
well-behaved client (an example trainer as a new worker), and after hundreds of oversized
frames and garbage connections its resident memory has grown by less than MEMORY_BOUND.
Admission: 100 idle connections that never connect do not lock a worker out and are closed
(oldest first, then after auth_timeout_seconds); a wrong token is refused and logged with the
peer's address; a worker refused at max_connections gets [overloaded] and retries until a
session ends.

Usage: frame_fault_test.py BUILD_DIR
Standard library only. Every wait is bounded (socket timeouts); nothing sleeps to synchronise.
"""
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

from free_ports import free_ports
from process_checks import check

LISTEN, HTTP = free_ports(2)
WORKERS = 64                 # each check trains as a new worker
MAX_MESSAGE = 1 << 20
MAX_CONNECTIONS = 2   # sessions
MAX_WAITING = 8       # connections not yet authenticated
AUTH_SECONDS = 5   # longer than STALL_SECONDS: the stalled frame test sees the stall first
TOKEN = "frame-fault-token"
MEMORY_BOUND = 64 << 20
STALL_SECONDS = 2
WAIT = 30  # seconds a socket waits for the server before the test gives up

CONFIG = f"""mode: async
workers: {WORKERS}
auth: {{token: {TOKEN}}}
shards:
  - listen: 127.0.0.1:{LISTEN}
    http: 127.0.0.1:{HTTP}
limits:
  max_message_bytes: {MAX_MESSAGE}
  max_connections: {MAX_CONNECTIONS}
  stall_timeout_seconds: {STALL_SECONDS}
  max_unauthenticated_connections: {MAX_WAITING}
  auth_timeout_seconds: {AUTH_SECONDS}
"""


def frame_header(segment_words):
    """A Cap'n Proto stream frame header: segment count - 1, each segment's size in words,
    padded to a whole word."""
    header = struct.pack("<I", len(segment_words) - 1)
    header += b"".join(struct.pack("<I", w) for w in segment_words)
    return header + b"\0" * (-len(header) % 8)


class Server:
    def __init__(self, build):
        self.build = build
        self.work = tempfile.mkdtemp(prefix="psched_frame_fault_")
        self.config = os.path.join(self.work, "test.yaml")
        open(self.config, "w").write(CONFIG)
        self.log = open(os.path.join(self.work, "server.log"), "w+")
        self.process = subprocess.Popen(
            [os.path.join(build, "apps", "psched-server"), "--config", self.config],
            stderr=self.log)
        self.next_worker = 0
        for _ in range(400):  # bounded wait until the shard serves RPC and HTTP
            if "listening on" in self.text() and "dashboard on" in self.text():
                return
            check(self.process.poll() is None, "psched-server exited:\n" + self.text())
            time.sleep(0.05)
        raise AssertionError("psched-server did not start:\n" + self.text())

    def text(self):
        self.log.seek(0)
        return self.log.read()

    def rss_bytes(self):
        for line in open(f"/proc/{self.process.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def wait_connections(self, count):
        """Waits (bounded) until the shard reports `count` open RPC connections."""
        for _ in range(400):
            with urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/status", timeout=WAIT) as r:
                if json.load(r)["connected_workers"] == count:
                    return
            time.sleep(0.05)
        raise AssertionError(f"the shard never reported {count} open connections")

    def connect(self):
        s = socket.create_connection(("127.0.0.1", LISTEN), timeout=WAIT)
        s.settimeout(WAIT)
        return s

    def trainer(self, *extra, config=None, **kwargs):
        worker = self.next_worker
        self.next_worker += 1
        return subprocess.Popen(
            [os.path.join(self.build, "apps", "psched-example-trainer"), "--config",
             config or self.config, "--worker", str(worker), "--steps", "5", "--print-every", "5",
             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)

    def check_serving(self, after):
        """A new worker trains 5 steps: connect, register, push, poll."""
        check(self.process.poll() is None, f"after {after}: the server died:\n" + self.text())
        worker = self.next_worker
        self.next_worker += 1
        run = subprocess.run(
            [os.path.join(self.build, "apps", "psched-example-trainer"), "--config", self.config,
             "--worker", str(worker), "--steps", "5", "--print-every", "5"],
            capture_output=True, text=True, timeout=120)
        check(run.returncode == 0,
              f"after {after}: worker {worker} failed:\n{run.stdout}{run.stderr}\n" + self.text())
        print(f"ok: {after}; worker {worker} trained", flush=True)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)
        shutil.rmtree(self.work)


def closed_by_server(s):
    """Reads until the server closes the connection (an answer may come first)."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    s.close()
    return True


def send_and_expect_close(server, data, then_close_sending=False):
    """Sends `data` (then closes the sending side, if asked) and expects the server to close."""
    s = server.connect()
    try:
        s.sendall(data)
        if then_close_sending:
            s.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the server closed first: fine
    closed_by_server(s)


def garbage(server):
    rng = random.Random(5)
    # Random bytes may announce a frame longer than they are: the client then closes its side.
    for size in [1, 7, 8, 100, 4096, 1 << 16]:
        send_and_expect_close(server, bytes(rng.getrandbits(8) for _ in range(size)), True)
    send_and_expect_close(server, b"\xff" * 8)  # 2^32 segments: refused from the first word
    # A well-formed frame whose message is not an RPC message (a struct of garbage pointers).
    body = bytes(rng.getrandbits(8) for _ in range(64))
    send_and_expect_close(server, frame_header([8]) + body)
    server.check_serving("garbage bytes")


def truncated(server):
    # A valid header announcing 100 words; 40 bytes of body; then the client closes.
    s = server.connect()
    s.sendall(frame_header([100]) + b"\0" * 40)
    s.shutdown(socket.SHUT_WR)
    closed_by_server(s)
    # Cut inside the segment table, then close.
    s = server.connect()
    s.sendall(struct.pack("<I", 3) + struct.pack("<I", 10))
    s.shutdown(socket.SHUT_WR)
    closed_by_server(s)
    # A half frame, then silence: the shard serves others meanwhile and drops the stalled
    # connection after the stall timeout (the socket's own timeout bounds the wait).
    stalled = server.connect()
    stalled.sendall(frame_header([1000]) + b"\0" * 4000)
    server.check_serving("a stalled half frame")
    closed_by_server(stalled)
    check("(limits.stall_timeout_seconds)" in server.text(), "no log line names the stall")
    server.check_serving("truncated frames")


def oversized(server):
    before = server.rss_bytes()
    for i in range(200):
        # Beyond the traversal limit (about 2 x max_message_bytes): refused from the header.
        send_and_expect_close(server, frame_header([1 << 28]))
        send_and_expect_close(server, frame_header([1 << 20] * 4))
        send_and_expect_close(server, frame_header([0xFFFFFFFF, 0xFFFFFFFF]))
    # Within the traversal limit but over max_message_bytes, body sent in full: the garbage
    # body is refused, and the memory it took is given back.
    for i in range(20):
        words = (3 * MAX_MESSAGE // 2) // 8
        send_and_expect_close(server, frame_header([words]) + b"\x01" * (words * 8))
    grown = server.rss_bytes() - before
    print(f"resident memory grew {grown >> 10} KiB over 620 oversized frames", flush=True)
    check(grown < MEMORY_BOUND, f"resident memory grew {grown} bytes")
    server.check_serving("oversized frames")


def many_connections(server):
    before = server.rss_bytes()
    rng = random.Random(7)
    for round in range(10):
        sockets = [server.connect() for _ in range(3 * 16)]
        for s in sockets:
            try:
                s.sendall(bytes(rng.getrandbits(8) for _ in range(256)))
            except (BrokenPipeError, ConnectionResetError):
                pass
        for s in sockets:
            closed_by_server(s)
    grown = server.rss_bytes() - before
    check(grown < MEMORY_BOUND, f"resident memory grew {grown} bytes")
    server.wait_connections(0)
    server.check_serving("480 garbage connections, 48 at a time")


def unauthenticated(server):
    # 100 idle connections that never connect: at most MAX_WAITING wait at once (a new one
    # closes the oldest), a worker gets in while they are open, and the rest are closed after
    # AUTH_SECONDS (the sockets' own timeout bounds every wait).
    server.wait_connections(0)
    idle = [server.connect() for _ in range(100)]
    server.check_serving("100 idle connections that never connect")
    for s in idle[:100 - MAX_WAITING]:
        closed_by_server(s)
    check("limits.max_unauthenticated_connections" in server.text(),
          "no log line names the limit on waiting connections")
    for s in idle[100 - MAX_WAITING:]:
        closed_by_server(s)
    check("(limits.auth_timeout_seconds)" in server.text(), "no log line names the deadline")
    server.wait_connections(0)
    server.check_serving("idle connections closed")


def refusals(server):
    # A wrong token is refused, and the server log says who and why.
    wrong = os.path.join(server.work, "wrong.yaml")
    open(wrong, "w").write(CONFIG.replace(TOKEN, "not-the-token"))
    out, _ = server.trainer(config=wrong).communicate(timeout=120)
    check("wrong auth token" in out, "a wrong token was not refused:\n" + out)
    check("refused 127.0.0.1:" in server.text() and "wrong auth token" in server.text(),
          "the refusal is not in the server log:\n" + server.text())
    print("ok: a wrong token is refused and logged", flush=True)


def connection_limit(server):
    # MAX_CONNECTIONS workers hold sessions; one more is refused with [overloaded] and retries
    # until a session ends, then trains.
    server.wait_connections(0)
    holders = [server.trainer("--hold", stdin=subprocess.PIPE) for _ in range(MAX_CONNECTIONS)]
    for h in holders:
        for line in h.stdout:
            if "serving until stdin closes" in line:
                break
    late = server.trainer()
    said = ""
    for line in late.stdout:
        said += line
        if "refused the connection" in line:
            break
    check(f"is at max_connections ({MAX_CONNECTIONS}" in said and "[overloaded]" in said,
          "the worker over the limit was not told [overloaded]:\n" + said)
    holders[0].stdin.close()
    holders[0].wait(timeout=60)
    out, _ = late.communicate(timeout=120)
    check(late.returncode == 0, "the refused worker did not get in after a session ended:\n" +
          said + out)
    check("limits.max_connections" in server.text(), "no log line names the connection limit")
    for h in holders[1:]:
        h.stdin.close()
        h.wait(timeout=60)
    server.wait_connections(0)
    print(f"ok: a worker over max_connections retried: {said.strip().splitlines()[-1][:160]}",
          flush=True)


def main():
    build = sys.argv[1]
    server = Server(build)
    try:
        server.check_serving("start")
        for fault in [garbage, truncated, oversized, many_connections, unauthenticated,
                      refusals, connection_limit]:
            fault(server)
    finally:
        server.stop()
    print("all frame faults survived")


if __name__ == "__main__":
    main()
