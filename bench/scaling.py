#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How psched's cost grows with the job, in one run:

  transport  psched-transport-bench --sizes 1MiB --workers N: N clients at once against one
             shard, each pipelining its own variable of 1 MiB partitions, against N plain TCP
             echo streams in the same run: aggregate GB/s (one way), ratio to TCP, CPU
             seconds per GB of the whole process (both ends live in it).
  memory     psched-server (one shard, async) and N psched-member-client workers pushing the
             same three variables (52,900 floats) for --member-steps steps: the shard's peak
             resident memory (VmHWM) and its resident memory before any worker connected.
  schedule   psched-bench --model M --workers N --shards 2 --policy priority: N emulated
             trainers at --bandwidth each: aggregate GB/s (gradients up plus values down), CPU
             seconds per GB by thread role, iteration time against the fluid ideal.

Every process of a run shares this machine's cores: on a 2-core guest the bend is where the
cores run out, which the CPU seconds per GB show. Writes JSON and, with --plot, an SVG.

    bench/scaling.py --build build --json scaling.json --plot scaling.svg
        [--transport-workers 1,2,4,8,16,32,64] [--schedule-workers 2,4,8,16]
        [--model resnet50] [--bandwidth 10gbit] [--repeats 1]
Needs Debian's python3-matplotlib for --plot (scripts/setup installs it).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from free_ports import free_ports  # noqa: E402
from server_process import start_server  # noqa: E402


def numbers(text):
    return [int(x) for x in text.split(",")]


def run_json(command, work):
    """Runs a bench `command` with --json FILE; returns the file's JSON."""
    out = os.path.join(work, "out.json")
    run = subprocess.run(command + ["--json", out], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"scaling: {' '.join(command)} failed:\n{run.stdout}{run.stderr}")
    with open(out) as f:
        return json.load(f)


def transport(build, workers, seconds, work):
    doc = run_json([os.path.join(build, "bench", "psched-transport-bench"), "--sizes", "1MiB",
                    "--seconds", str(seconds), "--workers", str(workers)], work)
    size = doc["sizes"][0]
    case = size["aggregate"] if workers > 1 else size["pipelined"]
    return {"gb_per_s": case["psched"]["gb_per_s"], "tcp_gb_per_s": case["tcp"]["gb_per_s"],
            "ratio": case["ratio"], "cpu_s_per_gb": case["psched"]["cpu_s_per_gb"],
            "tcp_cpu_s_per_gb": case["tcp"]["cpu_s_per_gb"]}


def memory_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


def shard_memory(build, workers, steps, work):
    """The shard's resident memory before any worker connected and its peak (KiB)."""
    listen, http = free_ports(2)
    config = os.path.join(work, "job.yaml")
    with open(config, "w") as f:
        f.write(f"mode: async\nworkers: {workers}\nshards:\n"
                f"  - {{listen: 127.0.0.1:{listen}, http: 127.0.0.1:{http}}}\n")
    server = start_server(build, config, work, 1, "--threads", "1", "--apply-threads", "0")
    try:
        idle = memory_kib(server.pid, "VmRSS")
        clients = [subprocess.Popen(
            [os.path.join(build, "tests", "psched-member-client"), "--config", config,
             "--worker", str(w), "--steps", str(steps), "--compute-ms", "0", "--dump",
             os.path.join(work, f"values{w}.bin")], stdout=subprocess.DEVNULL)
            for w in range(workers)]
        for c in clients:
            if c.wait() != 0:
                sys.exit(f"scaling: a psched-member-client of {workers} exited {c.returncode}")
        peak = memory_kib(server.pid, "VmHWM")
    finally:
        server.kill()
        server.wait()
    return {"idle_kib": idle, "peak_kib": peak}


def schedule(build, workers, model, bandwidth, work):
    doc = run_json([os.path.join(build, "bench", "psched-bench"), "--model", model,
                    "--workers", str(workers), "--shards", "2", "--bandwidth", bandwidth,
                    "--policy", "priority", "--iters", "8"], work)
    r = doc["results"]["priority"]
    return {"gb_per_s": r["gb_per_s"], "cpu_s_per_gb": r["cpu_s_per_gb"],
            "iter_s": r["iter_s"], "of_ideal": doc["ideal_s"] / r["iter_s"],
            "cpu_share": r["cpu_share"]}


def median_of(runs):
    """Per key, the median of the runs and its range."""
    out = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            out[key] = median_of([r[key] for r in runs])
        else:
            values = [r[key] for r in runs]
            out[key] = {"median": statistics.median(values), "min": min(values),
                        "max": max(values)}
    return out


def sweep(name, counts, repeats, measure):
    results = {}
    for n in counts:
        runs = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix=f"psched_scaling_{name}_") as work:
                runs.append(measure(n, work))
        results[str(n)] = median_of(runs)
        print(f"{name} {n:>3} workers: " + ", ".join(
            f"{key} {value['median']:.4g}" for key, value in results[str(n)].items()
            if "median" in value), flush=True)
    return results


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    t, m, s = doc["transport"], doc["memory"], doc["schedule"]
    tn = [int(n) for n in t]
    axes[0].plot(tn, [t[n]["gb_per_s"]["median"] for n in t], "o-", label="psched, 1 shard")
    axes[0].plot(tn, [t[n]["tcp_gb_per_s"]["median"] for n in t], "s--", label="plain TCP")
    sn = [int(n) for n in s]
    axes[0].plot(sn, [s[n]["gb_per_s"]["median"] for n in s], "^-",
                 label=f"psched-bench {doc['model']}, 2 shards")
    axes[0].set(title="aggregate throughput", xlabel="workers", ylabel="GB/s")
    axes[1].plot(tn, [t[n]["cpu_s_per_gb"]["median"] for n in t], "o-", label="psched, 1 shard")
    axes[1].plot(tn, [t[n]["tcp_cpu_s_per_gb"]["median"] for n in t], "s--", label="plain TCP")
    axes[1].plot(sn, [s[n]["cpu_s_per_gb"]["total"]["median"] for n in s], "^-",
                 label=f"psched-bench {doc['model']}")
    axes[1].set(title="CPU seconds per GB (all processes)", xlabel="workers", ylabel="s/GB")
    mn = [int(n) for n in m]
    axes[2].plot(mn, [m[n]["peak_kib"]["median"] / 1024 for n in m], "o-", label="peak")
    axes[2].plot(mn, [m[n]["idle_kib"]["median"] / 1024 for n in m], "s--",
                 label="before any worker")
    axes[2].set(title="shard's resident memory", xlabel="workers", ylabel="MiB")
    axes[2].legend(fontsize=8)
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--json", required=True)
    parser.add_argument("--plot")
    parser.add_argument("--transport-workers", type=numbers, default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--schedule-workers", type=numbers, default=[2, 4, 8, 16])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--bandwidth", default="10gbit")
    parser.add_argument("--seconds", type=float, default=1.0, help="per transport case")
    parser.add_argument("--member-steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    doc = {"benchmark": "scaling", "model": args.model, "bandwidth": args.bandwidth,
           "repeats": args.repeats, "cores": os.cpu_count()}
    doc["transport"] = sweep("transport", args.transport_workers, args.repeats,
                             lambda n, work: transport(args.build, n, args.seconds, work))
    doc["memory"] = sweep("memory", args.transport_workers, args.repeats,
                          lambda n, work: shard_memory(args.build, n, args.member_steps, work))
    doc["schedule"] = sweep("schedule", args.schedule_workers, args.repeats,
                            lambda n, work: schedule(args.build, n, args.model, args.bandwidth,
                                                     work))
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    if args.plot:
        plot(doc, args.plot)


if __name__ == "__main__":
    main()
