#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Bounded staleness against sync with a straggler: psched-server (2 shards) and 4
psched-member-client workers (tests/member_client.cc: three variables, 52,900 floats a step,
each step sleeping as if computing), run once per mode and straggler in the same invocation:

  constant   worker 3 computes twice as long as the others, every step
  rotating   every 4th step of each worker is 4x as long, offset by the worker id, so at every
             step one worker straggles (stragglers that come and go, as on shared machines)

Prints each run's step rate of the workers that are not the constant straggler, and the ratio
bounded / sync per straggler, with the CPU seconds of all processes. Timing figures: run it
on a quiet machine and repeat (--repeat).

    bench/membership_bench.py --build build [--steps 200] [--compute-ms 10] [--staleness 2]
"""
import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from free_ports import free_ports  # noqa: E402
from server_process import start_server  # noqa: E402


def run(build, mode, staleness, straggler, steps, compute_ms):
    """Seconds per step of each worker but a constant straggler, and the CPU seconds used."""
    ports = free_ports(4)  # one call: distinct
    listen, http = ports[:2], ports[2:]
    with tempfile.TemporaryDirectory(prefix="psched_membership_bench_") as work:
        config = os.path.join(work, "job.yaml")
        with open(config, "w") as f:
            f.write(f"mode: {mode}\nworkers: 4\nsplit_bytes: 64KiB\n")
            if mode == "bounded":
                f.write(f"staleness: {staleness}\n")
            f.write("shards:\n")
            for port, view in zip(listen, http):
                f.write(f"  - {{listen: 127.0.0.1:{port}, http: 127.0.0.1:{view}}}\n")
        server = start_server(build, config, work, 2)
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        workers = []
        for w in range(4):
            command = [os.path.join(build, "tests", "psched-member-client"), "--config", config,
                       "--worker", str(w), "--steps", str(steps), "--dump",
                       os.path.join(work, f"values{w}.bin")]
            if straggler == "constant":
                command += ["--compute-ms", str(2 * compute_ms if w == 3 else compute_ms)]
            else:
                command += ["--compute-ms", str(compute_ms), "--slow-every", "4",
                            "--slow-ms", str(4 * compute_ms)]
            workers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        took = []
        for w, process in enumerate(workers):
            out, _ = process.communicate(timeout=600)
            if process.returncode != 0:
                sys.exit(f"membership_bench: worker {w} failed:\n{out}")
            if straggler != "constant" or w != 3:
                took.append(float(re.search(r"steps took (\S+) s", out).group(1)))
        server.terminate()
        server.wait()
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime +
                                                           cpu_before.ru_stime)
        return sum(took) / len(took) / steps, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--compute-ms", type=int, default=10)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    for straggler in ("constant", "rotating"):
        for attempt in range(args.repeat):
            rates = {}
            for mode in ("sync", "bounded"):
                seconds, cpu = run(args.build, mode, args.staleness, straggler, args.steps,
                                   args.compute_ms)
                rates[mode] = 1 / seconds
                label = mode if mode == "sync" else f"bounded k={args.staleness}"
                print(f"{straggler:8s} straggler  {label:12s} {rates[mode]:6.1f} steps/s "
                      f"({seconds * 1e3:.1f} ms a step; {cpu:.1f} CPU s in all)", flush=True)
            print(f"{straggler:8s} straggler  bounded / sync: {rates['bounded'] / rates['sync']:.2f}x"
                  f" (run {attempt + 1})", flush=True)


if __name__ == "__main__":
    main()
