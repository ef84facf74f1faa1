#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The operator view over real sockets: psched-server with two example trainers, then

  http     GET /metrics checked by a strict Prometheus text parser, GET /status checked against
           the known state after the pushes, bad requests (404, 405, 431, a slow client),
           `psched status` with the shards up and down, and the shards' trace (--trace) written
           at the stop;
  browser  the dashboard in headless Chromium: no console messages, the server's numbers on
           the page; saves a screenshot.

Usage: operator_view_test.py http|browser BUILD_DIR SOURCE_DIR
Standard library only. Every wait is bounded; nothing sleeps to synchronise.
"""
import collections
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from free_ports import free_ports
from process_checks import check, fail

STEPS = 20
FEATURES = 64  # the example trainer's default
WORKERS = 2
# Ports of this test's deployment: shards' RPC, shards' HTTP, the example trainer's HTTP.
LISTEN_AND_HTTP = free_ports(5)
LISTEN, HTTP, WORKER_HTTP = LISTEN_AND_HTTP[:2], LISTEN_AND_HTTP[2:4], LISTEN_AND_HTTP[4]


# --- the deployment -----------------------------------------------------------------------

class Deployment:
    """psched-server on a copy of configs/local.yaml with this test's ports, in a temp dir."""

    def __init__(self, build, source):
        self.build = build
        self.work = tempfile.mkdtemp(prefix="psched_operator_")
        text = open(os.path.join(source, "configs", "local.yaml")).read()
        for old, new in zip([7410, 7411, 8410, 8411], LISTEN + HTTP):
            text = text.replace(str(old), str(new))
        self.config = os.path.join(self.work, "test.yaml")
        open(self.config, "w").write(text)
        self.log = open(os.path.join(self.work, "server.log"), "w+")
        self.trace = os.path.join(self.work, "shards.trace.json")
        self.server = subprocess.Popen(
            [os.path.join(build, "apps", "psched-server"), "--config", self.config,
             "--trace", self.trace],
            stderr=self.log)
        for _ in range(400):  # bounded wait until both shards serve RPC and HTTP
            self.log.seek(0)
            text = self.log.read()
            if text.count("listening on") == 2 and text.count("dashboard on") == 2:
                return
            if self.server.poll() is not None:
                fail("psched-server exited:\n" + text)
            time.sleep(0.05)
        fail("psched-server did not start:\n" + text)

    def trainer(self, worker, steps=STEPS):
        return subprocess.run(
            [os.path.join(self.build, "apps", "psched-example-trainer"), "--config", self.config,
             "--worker", str(worker), "--steps", str(steps), "--print-every", str(steps)],
            capture_output=True, text=True, timeout=120)

    def train(self, worker_view=None):
        """Both workers train STEPS steps; then a worker with a bad id is refused once. With
        `worker_view(port)`, worker 0 serves its own view on port WORKER_HTTP, which is checked
        after training, while worker 0 holds."""
        procs = []
        for w in range(WORKERS):
            extra = ["--http", f"127.0.0.1:{WORKER_HTTP}", "--hold"] if w == 0 and worker_view else []
            procs.append(subprocess.Popen(
                [os.path.join(self.build, "apps", "psched-example-trainer"), "--config",
                 self.config, "--worker", str(w), "--steps", str(STEPS), "--print-every",
                 str(STEPS)] + extra,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        if worker_view:
            lines = []
            while not lines or "serving until stdin closes" not in lines[-1]:
                lines.append(procs[0].stdout.readline())
                check(lines[-1], "worker 0 ended before serving its view:\n" + "".join(lines))
            worker_view(WORKER_HTTP)
        for p in procs:
            out, _ = p.communicate(timeout=120)
            check(p.returncode == 0, "trainer failed:\n" + out)
        refused = self.trainer(7)
        check(refused.returncode != 0, "a worker id beyond the job's workers was accepted")

    def stop(self):
        if self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                fail("psched-server did not stop on SIGTERM")

    def close(self):
        if self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def get(port, path, method="GET"):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path)
    response = connection.getresponse()
    body = response.read().decode()
    connection.close()
    return response.status, response.getheader("Content-Type"), body


def status_of(port):
    code, kind, body = get(port, "/status")
    check(code == 200 and kind == "application/json", f"/status answered {code} {kind}")
    return json.loads(body)


# --- a strict parser of the Prometheus text format -----------------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
SAMPLE = re.compile(rf"^({NAME})(?:\{{(.*)\}})? (\S+)$")
LABEL_PAIR = re.compile(rf'({LABEL})="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
UNITS = ("_seconds", "_bytes")


def parse_value(text, line):
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    check(re.fullmatch(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?", text),
          f"bad sample value in: {line}")
    return float(text)


def parse_labels(text, line):
    labels, rest = {}, text or ""
    while rest:
        m = LABEL_PAIR.match(rest)
        check(m, f"bad labels in: {line}")
        check(not m.group(1).startswith("__"), f"reserved label name in: {line}")
        check(m.group(1) not in labels, f"repeated label in: {line}")
        labels[m.group(1)] = m.group(2)
        rest = rest[m.end():]
    return labels


def family_of(sample_name, families):
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample_name[: -len(suffix)] if sample_name.endswith(suffix) else None
        if base and families.get(base, {}).get("type") == "histogram":
            return base
    return sample_name


def parse_metrics(text):
    """{family: {"type", "help", "samples": [(name, labels, value)]}}; fails on any breach of
    the text format or of naming practice."""
    check(text.endswith("\n"), "the exposition does not end with a newline")
    families, current, seen = {}, None, set()
    for line in text[:-1].split("\n"):
        if line.startswith("#"):
            m = re.fullmatch(rf"# (HELP|TYPE) ({NAME}) (.+)", line)
            check(m, f"bad comment line: {line}")
            kind, name, rest = m.groups()
            family = families.setdefault(name, {"samples": []})
            check(not family["samples"], f"# {kind} after samples of {name}")
            check(kind.lower() not in family, f"second # {kind} for {name}")
            if kind == "TYPE":
                check(rest in ("counter", "gauge", "histogram"), f"unexpected type: {line}")
                check("help" in family, f"# TYPE before # HELP for {name}")
            family[kind.lower()] = rest
            current = name
            continue
        m = SAMPLE.match(line)
        check(m, f"bad sample line: {line!r}")
        name, labels, value = m.group(1), parse_labels(m.group(2), line), parse_value(m.group(3), line)
        family = family_of(name, families)
        check(family == current, f"sample {name} outside its family's block ({current})")
        check("type" in families[family], f"sample {name} before its # TYPE")
        key = (name, tuple(sorted(labels.items())))
        check(key not in seen, f"duplicate sample: {line}")
        seen.add(key)
        families[family]["samples"].append((name, labels, value))
    for name, family in families.items():
        check(name.startswith("psched_"), f"{name}: not in the psched_ namespace")
        check("type" in family, f"{name}: # HELP without # TYPE")
        if family["type"] == "counter":
            check(name.endswith("_total"), f"counter {name} does not end in _total")
        else:
            check(not name.endswith("_total"), f"{family['type']} {name} ends in _total")
        if family["type"] == "histogram":
            check(name.endswith(UNITS), f"histogram {name} has no unit suffix")
            check(family["samples"], f"histogram {name} without samples")
            check_histogram(name, family["samples"])
        for unit in ("milliseconds", "microseconds", "kilobytes", "megabytes"):
            check(unit not in name, f"{name}: use base units")
    return families


def check_histogram(name, samples):
    series = {}
    for sample_name, labels, value in samples:
        rest = {k: v for k, v in labels.items() if k != "le"}
        entry = series.setdefault(tuple(sorted(rest.items())), {"buckets": []})
        if sample_name.endswith("_bucket"):
            check("le" in labels, f"{name}: bucket without le")
            entry["buckets"].append((parse_value(labels["le"], sample_name), value))
        else:
            check("le" not in labels, f"{name}: le on {sample_name}")
            entry[sample_name[len(name) + 1:]] = value
    for labels, entry in series.items():
        buckets = entry["buckets"]
        check(buckets and buckets[-1][0] == math.inf, f"{name}{labels}: no +Inf bucket last")
        bounds = [b for b, _ in buckets]
        check(bounds == sorted(bounds) and len(set(bounds)) == len(bounds),
              f"{name}{labels}: le not strictly ascending")
        counts = [c for _, c in buckets]
        check(counts == sorted(counts), f"{name}{labels}: buckets not cumulative")
        check("sum" in entry and "count" in entry, f"{name}{labels}: no _sum or _count")
        check(entry["count"] == counts[-1], f"{name}{labels}: _count != +Inf bucket")


def value(families, name, shard, **labels):
    for sample_name, sample_labels, v in families[family_of(name, families)]["samples"]:
        if sample_name == name and sample_labels == {"shard": str(shard), **labels}:
            return v
    fail(f"no sample {name} for shard {shard} {labels}")


# --- the tests ----------------------------------------------------------------------------

def test_metrics(deployment):
    received = partitions = refused = slots = wire_sent = 0
    for shard, port in enumerate(HTTP):
        code, kind, body = get(port, "/metrics")
        check(code == 200, f"/metrics answered {code}")
        check(kind.startswith("text/plain; version=0.0.4"), f"/metrics Content-Type {kind}")
        families = parse_metrics(body)
        for family in ("psched_shard_received_bytes_total", "psched_shard_sent_bytes_total",
                       "psched_shard_partitions_applied_total", "psched_shard_apply_seconds",
                       "psched_shard_poll_wait_seconds", "psched_shard_waiting_polls",
                       "psched_shard_variables", "psched_shard_connected_workers",
                       "psched_shard_errors_total", "psched_process_uptime_seconds",
                       "psched_shard_wire_bytes_total"):
            check(family in families, f"/metrics has no {family}")
        received += value(families, "psched_shard_received_bytes_total", shard)
        # Nothing is compressed here: every payload travels as its dtype carries it (the two
        # variables may live on one shard: their names' slots place them).
        for direction in ("push", "pull"):
            raw, sent = (value(families, "psched_shard_wire_bytes_total", shard,
                               direction=direction, form=form) for form in ("raw", "sent"))
            check(raw == sent, f"shard {shard} {direction}: {sent} bytes sent of {raw} raw")
            wire_sent += sent
        partitions += value(families, "psched_shard_partitions_applied_total", shard)
        slots += value(families, "psched_shard_slots", shard)
        check(value(families, "psched_shard_slot_map_epoch", shard) == 1, "a new job's epoch")
        refused += value(families, "psched_shard_errors_total", shard, code="invalid_argument")
        check(value(families, "psched_shard_waiting_polls", shard) == 0, "polls still waiting")
        check(value(families, "psched_shard_apply_seconds_count", shard) ==
              value(families, "psched_shard_partitions_applied_total", shard),
              "one apply observation per applied partition")
    # Each worker pushes, per step, the weights (FEATURES floats) and the bias (one float).
    check(received == WORKERS * STEPS * (FEATURES + 1) * 4, f"received {received} bytes")
    check(partitions == WORKERS * STEPS * 2, f"{partitions} partitions applied")
    check(refused >= 1, "the refused worker was not counted as an invalid_argument error")
    check(slots == 4096, f"the shards own {slots} of the job's 4096 slots")
    check(wire_sent > 0, "no bytes on the wire")


def check_worker_view(port):
    code, kind, body = get(port, "/metrics")
    check(code == 200 and kind.startswith("text/plain; version=0.0.4"), f"worker /metrics {code}")
    families = parse_metrics(body)
    for family in ("psched_worker_credit_bytes", "psched_worker_credit_in_use_bytes",
                   "psched_worker_queued_partitions", "psched_worker_iteration_seconds"):
        check(family in families, f"worker /metrics has no {family}")
    code, kind, body = get(port, "/status")
    s = json.loads(body)
    check(s["worker"] == 0 and s["push_credit_in_use_bytes"] == 0
          and s["pull_credit_in_use_bytes"] == 0 and s["queued_partitions"] == 0,
          f"worker status after training: {s}")
    check(s["started_partitions"] == s["finished_partitions"] == STEPS * 2,
          f"worker partitions: {s}")
    check(s["iterations"] == STEPS - 1, f"worker iterations: {s}")


def test_status(deployment):
    steps, errors = {}, []
    for shard, port in enumerate(HTTP):
        s = status_of(port)
        check(s["shard"] == shard, f"shard {shard} says it is {s['shard']}")
        p = s["placement"]
        check(p["slot_map_epoch"] == 1 and p["shards"] == len(HTTP) and
              p["slots"] in (4096 // len(HTTP), 4096 // len(HTTP) + 1), f"placement {p}")
        check(s["config"]["mode"] == "async" and s["config"]["workers"] == WORKERS,
              f"config summary {s['config']}")
        check([x["http"] for x in s["config"]["shards"]] == [f"127.0.0.1:{p}" for p in HTTP],
              "config summary lacks the shards' http addresses")
        check(s["polls_waiting"] == 0, "polls still waiting")
        check(s["variables"] == len(s["variable_steps"]), "variable count and list differ")
        for v in s["variable_steps"]:
            steps[v["name"]] = v["step"]
        errors += s["recent_errors"]
    check(steps == {"logistic/w": STEPS, "logistic/b": STEPS}, f"variable steps {steps}")
    check(any("worker id 7" in e["message"] for e in errors), f"recent errors {errors}")


def read_status_line(sock):
    sock.settimeout(10)
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n")[0].decode()


def test_bad_requests(deployment):
    port = HTTP[0]
    check(get(port, "/no-such-page")[0] == 404, "an unknown path is not 404")
    check(get(port, "/status", method="POST")[0] == 405, "POST is not 405")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n")
        line = read_status_line(sock)
        check(line.startswith("HTTP/1.1 431"), f"huge headers answered {line!r}")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        line = read_status_line(sock)
        check(line.startswith("HTTP/1.1 400"), f"garbage answered {line!r}")
    # A slow client holds a half-sent request; others are served, and so are the shards.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(b"GET /status HTTP/1.1\r\nHo")
        check(status_of(port)["shard"] == 0, "a slow client stalled the HTTP server")
        # Worker 0 again, as a restarted worker: it goes on from its next step, two more steps.
        result = deployment.trainer(0, steps=STEPS + 2)
        check(result.returncode == 0 and f"joins the job at step {STEPS + 1}" in result.stdout
              and f"step {STEPS + 2:4d}" in result.stdout,
              "the shard did not answer a push while a slow client was connected:\n" +
              result.stdout + result.stderr)


def test_status_cli(deployment):
    cli = [os.path.join(deployment.build, "apps", "psched"), "status", "--config", deployment.config]
    up = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    check(up.returncode == 0, f"psched status failed:\n{up.stdout}{up.stderr}")
    rows = up.stdout.strip().split("\n")
    check(len(rows) == 5 and all(" up " in r for r in rows[1:3]), f"psched status:\n{up.stdout}")
    check(all(f"placement shard {i}: job " in rows[3 + i] and
              "slot map epoch 1 on 2 shard(s), 2048 of 4096 slots" in rows[3 + i]
              for i in range(2)), f"psched status placement:\n{up.stdout}")
    print(up.stdout)
    # One operator view, as a container's health check asks its own shard.
    one = [cli[0], "status", "--http", f"127.0.0.1:{HTTP[1]}", "--wait", "30"]
    mine = subprocess.run(one, capture_output=True, text=True, timeout=60)
    rows = mine.stdout.strip().split("\n")
    check(mine.returncode == 0 and len(rows) == 3 and f" up     127.0.0.1:{HTTP[1]} " in rows[1],
          f"psched status --http:\n{mine.stdout}{mine.stderr}")
    deployment.stop()
    down = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    check(down.returncode == 1 and down.stdout.count(" down ") == 2,
          f"psched status with the shards down:\n{down.stdout}{down.stderr}")
    print(down.stdout)
    started = time.monotonic()
    waited = subprocess.run(one[:-1] + ["1.5"], capture_output=True, text=True, timeout=60)
    check(waited.returncode == 1 and time.monotonic() - started >= 1.5,
          f"psched status --wait 1.5 with the shard down:\n{waited.stdout}{waited.stderr}")


def test_browser(deployment, build):
    chromium = shutil.which("chromium")
    check(chromium, "chromium is not installed (scripts/setup installs it)")
    screenshot = os.path.join(build, "tests", "dashboard.png")
    profile = os.path.join(deployment.work, "chromium")
    url = f"http://127.0.0.1:{HTTP[0]}/"
    # Virtual time runs the page's timers (several refreshes) without waiting in real time;
    # network fetches complete while it is paused.
    result = subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--user-data-dir=" + profile, "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=5000", "--window-size=1280,900",
         "--screenshot=" + screenshot, "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    check(result.returncode == 0, f"chromium failed:\n{result.stderr}")
    console = [l for l in result.stderr.split("\n") if ":CONSOLE" in l]
    check(not console, "the page wrote to the console:\n" + "\n".join(console))
    dom = result.stdout
    for shard, port in enumerate(HTTP):
        s = status_of(port)
        # Nothing is compressed; a shard that holds neither variable (their names' slots may
        # put both on one) shows "–" for a direction with no bytes yet.
        wire = " / ".join("1.00" if s["wire_bytes"][d]["raw"] else "–" for d in ("push", "pull"))
        for key, expected in (("state", "up"), ("partitions", s["partitions_applied"]),
                              ("variables", s["variables"]), ("polls", 0), ("wire", wire)):
            check(re.search(f'id="{key}-{shard}"[^>]*>{expected}<', dom),
                  f"the page does not show {key} {expected} for shard {shard}")
    for name in ("logistic/w", "logistic/b"):
        check(re.search(rf'id="step-\d-{name}"[^>]*>{STEPS}<', dom), f"the page lacks {name}'s step")
    check("worker id 7" in dom, "the page does not show the recent error")
    check(os.path.getsize(screenshot) > 0, "no screenshot")
    print(f"dashboard screenshot: {screenshot}")


def test_trace(deployment):
    """After the stop: every partition each worker pushed to each shard is traced once as a push
    and once as a poll, in every step, each a slice split into its two phases."""
    with open(deployment.trace) as f:
        events = json.load(f)["traceEvents"]
    shards = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    check(shards == {0: "shard 0", 1: "shard 1"}, f"trace processes: {shards}")
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    requests = collections.Counter()
    for i, e in enumerate(slices):
        kind = e["name"].split(" ")[0]
        if kind not in ("push", "poll"):
            continue
        first, second = slices[i + 1], slices[i + 2]
        check((first["name"], second["name"]) ==
              (("receive", "apply") if kind == "push" else ("wait", "answer")),
              f"phases of {e['name']}: {first['name']}, {second['name']}")
        check(first["ts"] == e["ts"] and second["dur"] >= 0 and first["dur"] >= 0 and
              abs(first["dur"] + second["dur"] - e["dur"]) < 1,
              f"phases of {e['name']} do not split it: {e}, {first}, {second}")
        worker = tracks[e["pid"], e["tid"]].split(" ")[1]
        args = e["args"]
        requests[e["pid"], worker, kind, args["variable"], args["begin"], args["step"]] += 1
    # Worker 0's second run (test_bad_requests), a restarted worker, polled step STEPS again
    # for its starting values, then pushed and polled two more steps.
    again = {k: n for k, n in requests.items() if n != 1}
    check(requests and all(k[1:3] == ("0", "poll") and k[5] == STEPS and n == 2
                           for k, n in again.items()),
          f"requests traced more than once: {again}")
    # The shards that host a variable (the job's slot map may put both on one shard).
    hosting = sorted({k[0] for k in requests})
    check(hosting, "no request traced")
    for shard in hosting:
        for worker in map(str, range(WORKERS)):
            last = STEPS + 2 if worker == "0" else STEPS
            for kind in ("push", "poll"):
                steps = {k[5] for k in requests if k[:3] == (shard, worker, kind)}
                check(steps == set(range(1, last + 1)),
                      f"shard {shard} worker {worker}: {kind}es of {len(steps)} steps traced, "
                      f"not {last}")


def main():
    mode, build, source = sys.argv[1:4]
    deployment = Deployment(build, source)
    try:
        deployment.train(check_worker_view if mode == "http" else None)
        if mode == "http":
            test_metrics(deployment)
            test_status(deployment)
            test_bad_requests(deployment)
            test_status_cli(deployment)
        else:
            test_browser(deployment, build)
        deployment.stop()
        if mode == "http":
            test_trace(deployment)
    except Exception:
        deployment.log.seek(0)
        sys.stderr.write("server log:\n" + deployment.log.read())
        raise
    finally:
        deployment.close()
    print(f"operator view {mode} test passed")


if __name__ == "__main__":
    main()
