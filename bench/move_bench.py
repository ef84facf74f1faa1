#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Whole shards moving between server processes while 2 workers train the click model
(bench/embedding_bench.py's DLRM-like model, psched sync mode, Adagrad rows, Adam MLPs):

    flock /work/bench.lock bench/move_bench.py --json bench/results/move_bench.json
    bench/move_bench.py --rows 20000 --steps 120 --repeats 1        # a quick look

A job of --shards (12) shards starts on servers a and b (6 each; `servers:`, psched-server
--server, docs/reliability.md "Moving shards between servers"), all sharing one checkpoint
directory. The workers train --steps steps; after --before steps server c starts and
`psched shards add` gives it its share (4 shards: 2 -> 3 servers), and once the workers are
--between steps further `psched shards remove --server c` hands them back (3 -> 2). For each
move:
  moved     the moved shards' rows and their bytes (values and optimizer state, from each
            shard's /status just before), against the fewest any placement moves: |M - N| /
            max(M, N) of all the rows' bytes; and the bytes the taking server read (the moved
            shards' newest checkpoints and the update logs after them)
  time      from the command to every moved shard hosted (the command's own wait), the
            moved shards' checkpoint bytes a second against loopback TCP's (one stream, this
            process) and their rows a second against the rate a table creates rows
            (psched-row-table-bench's first touch), both measured in the same run
  steps     the workers' median and longest step time during the move (a step that overlaps
            it, the slower worker's), against the median of the --window steps before it
The move's pause is the shard's restore on the taking server (checkpoint read, log replayed, a
new checkpoint written) while every sync step waits for it. Loopback, unshaped; CPU seconds of
each server process over the run beside them. --repeats runs it again; the summary gives
each figure's median and range.

JSON to --json (or stdout); progress to stderr.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
from free_ports import free_ports  # noqa: E402
from reshard_bench import create_rate, loopback_rate  # noqa: E402
from results_file import write_json  # noqa: E402
from torch_e2e import PYTHON, process_cpu_seconds  # noqa: E402


def log(message):
    print(message, file=sys.stderr, flush=True)


def get_json(address, path):
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as answer:
        return json.load(answer)


class Job:
    """The servers, their file and checkpoint directory; the workers."""

    def __init__(self, args, work):
        self.args, self.work = args, work
        ports = free_ports(2 * args.shards + 3)
        self.listen, self.http = ports[:args.shards], ports[args.shards:2 * args.shards]
        self.control = dict(zip("abc", ports[2 * args.shards:]))
        self.config = work / "job.yaml"
        text = ("mode: sync\nworkers: 2\ncheckpoint: {directory: state, interval_seconds: "
                f"{args.checkpoint_seconds}}}\nservers:\n")
        for name in "ab":
            text += f"  - {{name: {name}, control: '127.0.0.1:{self.control[name]}'}}\n"
        text += "shards:\n"
        for s in range(args.shards):
            server = "a" if s < args.shards // 2 else "b"
            text += (f"  - {{listen: '127.0.0.1:{self.listen[s]}', "
                     f"http: '127.0.0.1:{self.http[s]}', server: {server}}}\n")
        self.config.write_text(text)
        self.servers, self.cpu = {}, {}

    def start_server(self, name, *flags, hosting=0):
        """Starts server `name`; returns once it answers GET /server hosting `hosting` shards."""
        log_file = open(self.work / f"server_{name}.log", "a")
        self.servers[name] = subprocess.Popen(
            [str(pathlib.Path(self.args.build) / "apps" / "psched-server"), "--config",
             str(self.config), "--server", name, "--threads", "2", *flags], stderr=log_file)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                answer = get_json(f"127.0.0.1:{self.control[name]}", "/server")
                if len(answer["hosted"]) == hosting:
                    return answer
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server {name} did not answer:\n" +
                           (self.work / f"server_{name}.log").read_text())

    def shards(self, *args):
        command = [str(pathlib.Path(self.args.build) / "apps" / "psched"), "shards", *args,
                   "--config", str(self.config), "--wait", "600"]
        start = time.time()
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        end = time.time()
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stdout}{done.stderr}")
        return start, end, done.stdout

    def shard_payload(self):
        """Per shard: (rows, payload bytes) of its tables, from its /status."""
        out = []
        for s in range(self.args.shards):
            tables = get_json(f"127.0.0.1:{self.http[s]}", "/status")["tables"]
            out.append((sum(t["rows"] for t in tables), sum(t["payload_bytes"] for t in tables)))
        return out

    def files_of(self, shard):
        """The bytes of shard's newest checkpoint and the logs after it."""
        state = self.work / "state"
        newest = max(state.glob(f"shard-{shard}.*.ckpt"), key=lambda p: p.name)
        generation = int(newest.name.split(".")[1])
        logs = [p for p in state.glob(f"shard-{shard}.*.log")
                if int(p.name.split(".")[1]) >= generation]
        return newest.stat().st_size + sum(p.stat().st_size for p in logs)

    def stop(self):
        for process in self.servers.values():
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()


def moved_shards(stdout):
    """The shards a psched shards command said it moved."""
    return [int(line.split(":")[0].split()[1]) for line in stdout.splitlines()
            if " -> " in line and line.startswith("shard ")]


def start_workers(args, job, work):
    spec = {"mode": "psched", "tables": args.tables, "rows": args.rows, "dim": args.dim,
            "ids_per_bag": 20, "batch": 2048, "lr": 1e-3, "row_lr": 0.05, "seed": 1,
            "eval_every": 0, "steps": args.steps, "warmup": 1, "workers": 2,
            "test_samples": 1024, "config": str(job.config)}
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(pathlib.Path(args.build) / "python"),
                                                        os.environ.get("PYTHONPATH")])))
    processes = []
    for rank in (0, 1):
        errors = open(work / f"w{rank}.err", "w")
        processes.append(subprocess.Popen(
            [PYTHON, str(HERE / "embedding_bench.py"), "--worker",
             json.dumps(dict(spec, rank=rank, out=str(work / f"w{rank}.json")))],
            env=env, stdout=errors, stderr=errors))
    return processes


def step_figures(workers, window, before_count):
    """Median and longest step during `window` (steps overlapping it, the slower worker's) and
    the median of the `before_count` steps that ended before it."""
    during, before = [], []
    for w in workers:
        spans = list(zip(w["step_start_wall"], w["step_s"]))
        during.append([d for s, d in spans if s < window[1] and s + d > window[0]])
        before.append([d for s, d in spans if s + d <= window[0]][-before_count:])
    during_median = max(statistics.median(d) for d in during if d) if all(during) else None
    return {"before_median_s": max(statistics.median(b) for b in before),
            "during_median_s": during_median,
            "during_max_s": max(max(d) for d in during if d) if any(during) else None,
            "steps_during": max(len(d) for d in during)}


def job_step(job):
    """The newest step any dense variable reached, over the shards' /status."""
    steps = [0]
    for s in range(job.args.shards):
        status = get_json(f"127.0.0.1:{job.http[s]}", "/status")
        steps += [v["step"] for v in status["variable_steps"]]
    return max(steps)


def wait_steps(job, work, target, processes):
    """Waits until the workers have run `target` steps."""
    while job_step(job) < target:
        if any(p.poll() is not None for p in processes):
            raise RuntimeError("a worker ended early:\n" + (work / "w0.err").read_text()[-3000:])
        time.sleep(0.5)


def one_run(args, loopback, creating):
    work = pathlib.Path(tempfile.mkdtemp(prefix="move_bench-"))
    job = Job(args, work)
    processes = []
    try:
        job.start_server("a", hosting=args.shards // 2)
        job.start_server("b", hosting=args.shards - args.shards // 2)
        processes = start_workers(args, job, work)
        moves = []
        wait_steps(job, work, args.before, processes)
        job.start_server("c", "--control", f"127.0.0.1:{job.control['c']}")
        for command, servers in ((["add", "--server", "c", "--control",
                                   f"127.0.0.1:{job.control['c']}"], (2, 3)),
                                 (["remove", "--server", "c"], (3, 2))):
            payload = job.shard_payload()
            start, end, stdout = job.shards(*command)
            moved = moved_shards(stdout)
            total = sum(p[1] for p in payload)
            fewest = total * abs(servers[1] - servers[0]) / max(servers)
            read = sum(job.files_of(s) for s in moved)
            moves.append({"servers": servers, "shards": moved, "window": [start, end],
                          "seconds": end - start, "rows": sum(payload[s][0] for s in moved),
                          "payload_bytes": sum(payload[s][1] for s in moved),
                          "of_fewest": sum(payload[s][1] for s in moved) / fewest,
                          "bytes_read": read, "read_rate": read / (end - start),
                          "of_loopback": read / (end - start) / loopback,
                          "rows_per_s": sum(payload[s][0] for s in moved) / (end - start),
                          "of_creating": sum(payload[s][0] for s in moved) / (end - start) /
                          creating})
            log(f"  {servers[0]} -> {servers[1]} servers: shards {moved}, "
                f"{moves[-1]['rows']} rows, {end - start:.2f} s")
            if command[0] == "add":
                wait_steps(job, work, args.before + args.between, processes)
        for rank, process in enumerate(processes):
            if process.wait(timeout=args.timeout) != 0:
                raise RuntimeError(f"worker {rank} failed:\n" +
                                   (work / f"w{rank}.err").read_text()[-3000:])
        workers = [json.loads((work / f"w{r}.json").read_text()) for r in (0, 1)]
        for move in moves:
            move.update(step_figures(workers, move["window"], args.window))
        cpu = {name: process_cpu_seconds(p.pid) for name, p in job.servers.items()
               if p.poll() is None}
        return {"moves": moves, "server_cpu_s": cpu,
                "test_logloss": workers[0]["test_logloss"]}
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        job.stop()
        if args.keep:
            log(f"  kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def summarize(runs):
    out = []
    for i in range(len(runs[0]["moves"])):
        entry = {"servers": runs[0]["moves"][i]["servers"]}
        for key in ("seconds", "rows", "of_fewest", "bytes_read", "read_rate", "of_loopback",
                    "rows_per_s", "of_creating",
                    "before_median_s", "during_median_s", "during_max_s"):
            values = [r["moves"][i][key] for r in runs if r["moves"][i][key] is not None]
            entry[key] = {"median": statistics.median(values), "min": min(values),
                          "max": max(values)} if values else None
        ratios = [r["moves"][i]["during_median_s"] / r["moves"][i]["before_median_s"]
                  for r in runs if r["moves"][i]["during_median_s"]]
        entry["during_over_before"] = {"median": statistics.median(ratios), "min": min(ratios),
                                       "max": max(ratios)} if ratios else None
        out.append(entry)
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=str(ROOT / "build"))
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=250_000, help="rows a table")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--before", type=int, default=150, help="steps before the add")
    parser.add_argument("--between", type=int, default=100, help="steps between the moves")
    parser.add_argument("--window", type=int, default=50, help="steps before a move compared")
    parser.add_argument("--checkpoint-seconds", type=float, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--keep", action="store_true",
                        help="keep each run's folder (servers' logs, checkpoints)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    loopback = loopback_rate()
    creating = create_rate(args.build, args.dim)
    log(f"loopback TCP: {loopback / (1 << 20):.0f} MiB/s; a table creates "
        f"{creating / 1e6:.2f} M rows/s")
    runs = []
    for repeat in range(args.repeats):
        log(f"run {repeat + 1}/{args.repeats}")
        runs.append(one_run(args, loopback, creating))
    result = {"command": "bench/move_bench.py " + " ".join(argv), "args": vars(args),
              "loopback_bytes_per_s": loopback, "table_creates_rows_per_s": creating,
              "runs": runs, "summary": summarize(runs)}
    for entry in result["summary"]:
        log(json.dumps(entry))
    if args.json:
        write_json(args.json, result)
    else:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
