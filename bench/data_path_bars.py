#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The data path's benchmark bars (docs/benchmarks.md, "The data path's bars"), measured and
judged in one command: runs the transport and scheduling benchmarks `--runs` times,
interleaved, keeps every JSON in `--out`, and prints each bar with the median (lowest-highest)
of its runs and whether the median meets it ("every run" bars: the lowest).

    bench/data_path_bars.py run [--build build] [--runs 3] [--out DIR] [--quick]
    bench/data_path_bars.py report DIR

`run` needs root for the tc tbf links of the scheduling runs (as psched-bench does); --quick
is a smoke of this script (tiny sizes and model, in-process shaping), not a measurement. Exit
status 0 once the report is printed, whatever it says; 2 when a benchmark fails.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

SIZES = ("4KiB", "256KiB", "1MiB", "16MiB")
FOOTPRINT_SIZES = ("256KiB", "1MiB")  # --echo-buffers 8 is no baseline at 16 MiB
UNSCALED_GBIT = (4, 10)


def transport_runs(quick):
    """(file stem, arguments) of the two transport runs of one round."""
    if quick:
        common = ["--seconds", "0.05", "--workers", "2"]
        return [("transport", ["--sizes", "4KiB,256KiB"] + common),
                ("transport-echo8", ["--sizes", "256KiB", "--echo-buffers", "8"] + common)]
    common = ["--seconds", "1", "--workers", "8"]
    return [("transport", ["--sizes", ",".join(SIZES)] + common),
            ("transport-echo8", ["--sizes", ",".join(FOOTPRINT_SIZES), "--echo-buffers", "8"] +
             common)]


def scheduling_runs(quick):
    """(file stem, arguments) of the scheduling runs of one round."""
    if quick:
        here = os.path.dirname(os.path.abspath(__file__))
        model = ["--model", os.path.join(here, "tiny_profile.json"), "--iters", "4",
                 "--shaping", "inprocess"]
    else:
        model = ["--model", "resnet50"]
    runs = [("eight-workers", model + ["--workers", "8", "--shards", "2", "--policy", "priority"])]
    for gbit in UNSCALED_GBIT:
        runs.append((f"unscaled-{gbit}gbit",
                     model + ["--workers", "1", "--shards", "1", "--time-scale", "1",
                              "--byte-scale", "1", "--bandwidth", f"{gbit}gbit",
                              "--policy", "fifo,priority"]))
    return runs


def run(args):
    os.makedirs(args.out, exist_ok=True)
    transport = os.path.join(args.build, "bench", "psched-transport-bench")
    scheduling = os.path.join(args.build, "bench", "psched-bench")
    rounds = 1 if args.quick else args.runs
    for i in range(1, rounds + 1):
        jobs = [(transport, stem, a) for stem, a in transport_runs(args.quick)]
        jobs += [(scheduling, stem, a) for stem, a in scheduling_runs(args.quick)]
        for binary, stem, arguments in jobs:
            path = os.path.join(args.out, f"{stem}-{i}.json")
            print(f"== run {i}/{rounds}: {stem}", file=sys.stderr, flush=True)
            done = subprocess.run([binary] + arguments + ["--json", path],
                                  stdout=subprocess.DEVNULL)
            if done.returncode != 0:
                print(f"data_path_bars: {stem} run {i} failed ({done.returncode})",
                      file=sys.stderr)
                return 2
    return report(args.out, args.quick)


def load(directory, stem):
    """Every run's JSON of one benchmark: `stem`-N.json."""
    runs = re.compile(re.escape(stem) + r"-[0-9]+\.json")
    return [json.load(open(os.path.join(directory, name)))
            for name in sorted(os.listdir(directory)) if runs.fullmatch(name)]


def spaced(size):
    """4KiB -> 4 KiB, as the docs write sizes."""
    return size[:-3] + " " + size[-3:]


def transport_case(docs, size, case):
    """Every run's figures of one size and case, where the run had them."""
    found = []
    for doc in docs:
        for s in doc["sizes"]:
            if s["size"] == size and case in s:
                found.append(s[case])
    return found


def ratios(docs, size, case, key="ratio"):
    """Every run's `key` of one size and case (by default psched's GB/s over TCP's)."""
    return [c[key] for c in transport_case(docs, size, case)]


def spread(values):
    """Median (lowest-highest)."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


class Report:
    def __init__(self):
        self.met = self.judged = 0

    def bar(self, name, values, target, at_least=True, judge=statistics.median):
        """One bar: its runs' median (lowest-highest) and whether `judge` of them meets it."""
        if not values:
            print(f"  {name:<52} not measured")
            return
        judged = judge(values)
        ok = judged >= target if at_least else judged <= target
        self.judged += 1
        self.met += ok
        sign = ">=" if at_least else "<="
        print(f"  {name:<52} {spread(values):<20} bar {sign} {target:<5} "
              f"{'met' if ok else 'MISSED'}")

    def info(self, name, values):
        if values:
            print(f"  {name:<52} {spread(values)}")


def of_ideal(doc, policy):
    return doc["ideal_s"] / doc["results"][policy]["iter_s"]


def report(directory, quick=False):
    transport, echo8 = load(directory, "transport"), load(directory, "transport-echo8")
    r = Report()
    if quick:
        print("QUICK: a smoke of this script; the figures are not the bars' measurements")
    print(f"psched-transport-bench, {len(transport)} runs (psched over TCP echo):")
    for size in SIZES:
        if size == "4KiB":
            r.bar("4 KiB p50, psched over TCP",
                  [c["psched"]["p50_us"] / c["tcp"]["p50_us"]
                   for c in transport_case(transport, size, "sequential")], 2.0, at_least=False)
            continue
        sequential, pipelined = (0.7, 0.85) if size == "256KiB" else (0.9, 0.9)
        r.bar(f"{spaced(size)} sequential", ratios(transport, size, "sequential"), sequential)
        r.bar(f"{spaced(size)} pipelined", ratios(transport, size, "pipelined"), pipelined)
    workers = transport[0]["workers"] if transport else 8
    for size in SIZES:
        r.bar(f"{spaced(size)}, {workers} workers", ratios(transport, size, "aggregate"), 0.8)
    print(f"the same against the echo through psched's memory (--echo-buffers 8), "
          f"{len(echo8)} runs, not a bar:")
    for size in FOOTPRINT_SIZES:
        r.info(f"{spaced(size)} pipelined", ratios(echo8, size, "pipelined"))
        r.info(f"{spaced(size)}, {workers} workers", ratios(echo8, size, "aggregate"))
        r.info(f"{spaced(size)}, {workers} workers: the loop echo over TCP",
               ratios(echo8, size, "aggregate", "loop_ratio"))

    eight = load(directory, "eight-workers")
    print(f"psched-bench, scaled, 8 workers, 2 shards, {len(eight)} runs (of the ideal):")
    r.bar("priority", [of_ideal(d, "priority") for d in eight], 0.85)
    for gbit in UNSCALED_GBIT:
        docs = load(directory, f"unscaled-{gbit}gbit")
        print(f"psched-bench, unscaled, {gbit} Gbit/s, 1 worker, 1 shard, {len(docs)} runs:")
        if gbit == 4:
            r.bar("priority of the ideal, every run", [of_ideal(d, "priority") for d in docs],
                  0.9, judge=min)
        else:
            r.bar("priority of the ideal", [of_ideal(d, "priority") for d in docs], 0.85)
            r.bar("priority over fifo (iteration time, fifo/priority)",
                  [d["results"]["fifo"]["iter_s"] / d["results"]["priority"]["iter_s"]
                   for d in docs], 1.0)
        r.info("TCP both ways, of the link", [d["tcp_bps"] / d["bandwidth_bps"] for d in docs
                                              if d.get("tcp_bps")])
        r.info("CPU s/GB, priority", [d["results"]["priority"]["cpu_s_per_gb"]["total"]
                                      for d in docs])
    print(f"bars met: {r.met} of {r.judged}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="measure, then report")
    p_run.add_argument("--build", default="build", help="the build folder (default: build)")
    p_run.add_argument("--runs", type=int, default=3, help="rounds of every benchmark")
    p_run.add_argument("--out", default="data-path-bars", help="where the JSON files go")
    p_run.add_argument("--quick", action="store_true", help="a smoke of this script")
    p_report = sub.add_parser("report", help="judge the JSON files of an earlier run")
    p_report.add_argument("directory")
    args = parser.parse_args()
    if args.command == "run":
        if args.runs < 1:
            parser.error("--runs must be at least 1")
        return run(args)
    return report(args.directory)


if __name__ == "__main__":
    sys.exit(main())
