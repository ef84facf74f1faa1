#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Summarizes a `bench/torch_e2e.py --trace` file: per worker process, the median duration of
each trainer phase (forward, backward, optimizer step, synchronize) over the measured steps,
for psched workers the median and largest duration of each partition phase (queued, to
applied, value back) with their count, and for psched's shards the same of each request
phase (receive, apply, wait, answer).

    bench/torch_e2e_trace.py trace.json [--warmup 3]
"""
import argparse
import collections
import json
import statistics

TRAINER_LANE = 10000  # bench/torch_e2e_worker.py's write_trace


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the medians")
    args = parser.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    phases, partitions = collections.defaultdict(list), collections.defaultdict(list)
    for e in events:
        if e["ph"] != "X":
            continue
        if e.get("tid") == TRAINER_LANE:
            if e["args"]["step"] >= args.warmup:
                phases[e["pid"], e["name"]].append(e["dur"] / 1e3)
        elif e["name"] in ("queued", "to applied", "value back", "receive", "apply", "wait",
                           "answer"):
            partitions[e["pid"], e["name"]].append(e["dur"] / 1e3)
    for pid, name in sorted(names.items()):
        trainer = ", ".join(f"{phase} {statistics.median(v):.1f}"
                            for (p, phase), v in phases.items() if p == pid)
        parts = ", ".join(f"{phase} {statistics.median(v):.1f} (max {max(v):.1f}, n {len(v)})"
                          for (p, phase), v in partitions.items() if p == pid)
        print(f"{name}: ms median: {trainer}" + (f"; partitions: {parts}" if parts else ""))


if __name__ == "__main__":
    main()
