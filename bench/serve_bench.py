#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Inference against serving shards (psched-server --serve): lookups a second and latency at fixed
request rates on one and on two shards, with the shards' CPU, and a reload of a newer version
under a steady load.

The model is DLRM-like: --tables tables of --rows rows (dim --dim, float32), of which the first
--stored were trained (the job's checkpoint holds them); a request is one batch of --batch
samples with one id per table, drawn uniformly from the trained rows, looked up in every table
at once (a pull of each table's ids, all started, then all waited for), as an inference service
reads the rows of a batch. Steps:

1. a job on one shard trains the rows (one push of sgd per chunk of ids) and stops (its last
   checkpoint); `psched reshard` places it on two shards as well;
2. for 1 and 2 serving shards: a closed loop (--threads requests in flight) finds the most
   requests a second; then open loops at --loads of that rate for --seconds each: requests start
   on a fixed schedule whatever the earlier ones did, and a request's latency runs from its
   scheduled start (so a backlog shows, no coordinated omission); the shards' CPU seconds (their
   process's utime + stime) a second beside;
3. reload: a newer checkpoint of the same job is written beside (a trainer's server started on the
   two-shard folder and stopped: it writes the same values as a newer generation), then at half
   the closed-loop rate, SIGHUP to the serving shards mid-run: the requests that overlap the
   switch (from SIGHUP to the last shard's "now serving") against those before, and every
   request's outcome (a failed one is counted, not retried).

Baseline, same run: the same batches looked up by torch's F.embedding from tensors in this
process's memory (no network, one thread): the rows a second the machine gives without psched.

  bench/serve_bench.py [--build build] [--tables 8] [--rows 10000000] [--stored 1000000]
                       [--json bench/results/serve_bench.json]
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from free_ports import free_ports  # noqa: E402
from results_file import write_json  # noqa: E402
from server_process import start_server  # noqa: E402

CHUNK = 65536  # ids per push while the job trains


def deployment(path, shards, checkpoint=None):
    """A deployment file of `shards` shards on free loopback ports; its http ports."""
    ports = free_ports(2 * shards)
    listen = "".join(f"  - {{listen: 127.0.0.1:{port}, http: 127.0.0.1:{http}}}\n"
                     for port, http in zip(ports[:shards], ports[shards:]))
    text = (f"mode: async\nworkers: 1\nshards:\n{listen}optimizer: {{kind: sgd, lr: 0.1}}\n"
            "limits: {max_message_bytes: 256MiB}\n")
    if checkpoint:
        text += f"checkpoint: {{directory: {checkpoint}, interval_seconds: 0, update_log: false}}\n"
    with open(path, "w") as out:
        out.write(text)
    return ports[shards:]


def register(client, args):
    return [client.register_table(f"t{t}", args.rows, args.dim, optimizer="sgd",
                                  settings={"lr": 0.1}, init=("uniform", -0.05, 0.05), seed=t)
            for t in range(args.tables)]


def stop(server):
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=600)


def train(args, work, psched):
    """The job on one shard: every table's first --stored rows trained once, checkpointed."""
    state = os.path.join(work, "state-1")
    config = os.path.join(work, "train.yaml")
    deployment(config, 1, state)
    server = start_server(args.build, config, work, 1)
    try:
        client = psched.connect(config, 0)
        tables = register(client, args)
        gradient = np.full((CHUNK, args.dim), 0.5, np.float32)
        for table in tables:
            for step, begin in enumerate(range(0, args.stored, CHUNK), 1):
                ids = np.arange(begin, min(begin + CHUNK, args.stored), dtype=np.int64)
                client.push_rows(table, ids, gradient[:len(ids)], step)
            client.wait_rows(table, step)
        client.close()
    finally:
        stop(server)
    return state


def reshard(args, state, shards):
    placed = f"{state[:-2]}-{shards}"
    subprocess.run([os.path.join(args.build, "apps", "psched"), "reshard", "--from", state,
                    "--to", placed, "--shards", str(shards)], check=True,
                   stdout=subprocess.DEVNULL)
    return placed


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Inference:
    """An inference client of the serving shards: requests of one batch across every table."""

    def __init__(self, psched, config, args):
        self.client = psched.connect(config, 0, join=False)
        self.tables = register(self.client, args)
        self.args = args
        self.rng = np.random.default_rng(1)
        self.batches = [self.rng.integers(0, args.stored, (args.tables, args.batch),
                                          dtype=np.int64) for _ in range(64)]

    def request(self, index, out):
        ids = self.batches[index % len(self.batches)]
        pulls = [self.client.start_pull_rows(table, ids[t], out[t])
                 for t, table in enumerate(self.tables)]
        for pull in pulls:
            pull.wait()

    def out(self):
        return np.empty((self.args.tables, self.args.batch, self.args.dim), np.float32)


def closed_loop(inference, threads, seconds):
    """Requests a second with `threads` always in flight."""
    done = [0] * threads
    deadline = time.monotonic() + seconds

    def run(k):
        out = inference.out()
        while time.monotonic() < deadline:
            inference.request(k + threads * done[k], out)
            done[k] += 1

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    start = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(done) / (time.monotonic() - start)


def open_loop(inference, rate, seconds, threads, during=None):
    """Requests started `rate` a second on a fixed schedule for `seconds`; each one's (scheduled
    start, latency, error). `during(t0)`, if given, runs in a thread of its own from the start."""
    count = int(rate * seconds)
    results = [None] * count
    next_index = [0]
    lock = threading.Lock()
    t0 = time.monotonic() + 0.05

    def run():
        out = inference.out()
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= count:
                return
            at = t0 + i / rate
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            error = None
            try:
                inference.request(i, out)
            except Exception as e:  # counted, not retried
                error = str(e)
            results[i] = (at - t0, time.monotonic() - at, error)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    side = threading.Thread(target=during, args=(t0,)) if during else None
    for worker in workers:
        worker.start()
    if side:
        side.start()
    for worker in workers:
        worker.join()
    if side:
        side.join()
    return results


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(results, rows_per_request, seconds, cpu):
    latencies = [r[1] for r in results if r[2] is None]
    return {"requests": len(results), "failed": sum(r[2] is not None for r in results),
            "rows_per_s": len(latencies) * rows_per_request / seconds,
            "p50_ms": 1e3 * quantile(latencies, 0.5), "p99_ms": 1e3 * quantile(latencies, 0.99),
            "shard_cpu_per_s": cpu / seconds}


def local_baseline(args, inference, seconds):
    """Rows a second torch's F.embedding gathers from tables in this process's memory."""
    import torch
    import torch.nn.functional as F
    weights = [torch.rand(args.stored, args.dim) for _ in range(args.tables)]
    batches = [torch.from_numpy(b) for b in inference.batches]
    done, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        ids = batches[done % len(batches)]
        for t, weight in enumerate(weights):
            F.embedding(ids[t], weight)
        done += 1
    return done * args.tables * args.batch / (time.monotonic() - start)


def serve(args, work, psched, state, shards, reload=False):
    config = os.path.join(work, f"serve-{shards}.yaml")
    deployment(config, shards)
    log_dir = os.path.join(work, f"serve-{shards}")
    os.makedirs(log_dir, exist_ok=True)
    server = start_server(args.build, config, log_dir, shards, "--serve", state)
    rows = args.tables * args.batch
    try:
        inference = Inference(psched, config, args)
        closed_loop(inference, args.threads, 1)  # warm-up: connections, page cache
        peak = closed_loop(inference, args.threads, args.seconds)
        out = {"shards": shards, "closed_loop_requests_per_s": peak,
               "closed_loop_rows_per_s": peak * rows, "loads": []}
        for load in args.loads:
            before = cpu_seconds(server.pid)
            results = open_loop(inference, load * peak, args.seconds, 2 * args.threads)
            entry = summary(results, rows, args.seconds, cpu_seconds(server.pid) - before)
            entry.update(load=load, rate=load * peak)
            out["loads"].append(entry)
        if reload:
            out["reload"] = reload_under_load(args, work, server, log_dir, shards, state,
                                              inference, 0.5 * peak)
        inference.client.close()
        return out
    finally:
        stop(server)


def reload_under_load(args, work, server, log_dir, shards, state, inference, rate):
    """A newer checkpoint of the job written beside, then SIGHUP mid-run at `rate`."""
    config = os.path.join(work, "retrain.yaml")
    deployment(config, shards, state)
    retrain_dir = os.path.join(work, "retrain")
    os.makedirs(retrain_dir, exist_ok=True)
    stop(start_server(args.build, config, retrain_dir, shards))  # restore + stop: 2 generations
    log = os.path.join(log_dir, "server.log")
    window = {}

    def sighup(t0):
        time.sleep(max(0.0, t0 + args.seconds / 3 - time.monotonic()))
        window["start"] = time.monotonic() - t0
        server.send_signal(signal.SIGHUP)
        while open(log).read().count("now serving") < shards:
            time.sleep(0.005)
        window["end"] = time.monotonic() - t0

    before = cpu_seconds(server.pid)
    results = open_loop(inference, rate, args.seconds, 2 * args.threads, sighup)
    cpu = cpu_seconds(server.pid) - before
    start, end = window["start"], window["end"]
    overlapping = [r for r in results if r[0] + r[1] >= start and r[0] <= end]
    earlier = [r for r in results if r[0] + r[1] < start]
    rows = args.tables * args.batch
    return {"rate": rate, "switch_s": end - start,
            "before": summary(earlier, rows, start, 0),
            "during": summary(overlapping, rows, max(end - start, 1e-9), 0),
            "all": summary(results, rows, args.seconds, cpu)}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--loads", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.join(args.build, "python"))
    import psched
    with tempfile.TemporaryDirectory(prefix="psched-serve-bench-") as work:
        begin = time.monotonic()
        state = train(args, work, psched)
        placed = reshard(args, state, 2)
        prepared = time.monotonic() - begin
        runs = [serve(args, work, psched, state, 1),
                serve(args, work, psched, placed, 2, reload=True)]
        probe = Inference.__new__(Inference)
        probe.args, probe.rng = args, np.random.default_rng(1)
        probe.batches = [probe.rng.integers(0, args.stored, (args.tables, args.batch),
                                            dtype=np.int64) for _ in range(64)]
        local = local_baseline(args, probe, args.seconds / 2)
    result = {"command": "bench/serve_bench.py " + " ".join(argv), "args": vars(args),
              "prepare_s": prepared, "local_rows_per_s": local, "runs": runs}
    print(f"local F.embedding, one thread: {local / 1e6:.2f} M rows/s")
    for run in runs:
        print(f"{run['shards']} serving shard(s): closed loop ({args.threads} in flight) "
              f"{run['closed_loop_requests_per_s']:.0f} requests/s, "
              f"{run['closed_loop_rows_per_s'] / 1e6:.2f} M rows/s "
              f"({run['closed_loop_rows_per_s'] / local:.2f}x local)")
        for entry in run["loads"]:
            print(f"  at {entry['load']:.2f} of it: {entry['rows_per_s'] / 1e6:.2f} M rows/s, "
                  f"p50 {entry['p50_ms']:.2f} ms, p99 {entry['p99_ms']:.2f} ms, "
                  f"{entry['failed']} failed, shards' CPU {entry['shard_cpu_per_s']:.2f} s/s")
        if "reload" in run:
            r = run["reload"]
            print(f"  reload at {r['rate']:.0f} requests/s: switch {r['switch_s']:.2f} s; p99 "
                  f"before {r['before']['p99_ms']:.2f} ms, during {r['during']['p99_ms']:.2f} ms "
                  f"({r['during']['p99_ms'] / r['before']['p99_ms']:.2f}x); failed "
                  f"{r['all']['failed']} of {r['all']['requests']}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
