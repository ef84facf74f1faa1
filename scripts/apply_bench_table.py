#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Summarises runs of `psched-apply-bench --json` as a Markdown table: per optimizer and size,
the median over the runs (and the lowest-highest) of the apply's traffic GB/s and its ratios to
the baselines measured in the same run.

    for i in 1 2 3; do build/bench/psched-apply-bench --cpu-only --json run$i.json; done
    scripts/apply_bench_table.py run1.json run2.json run3.json

Columns: apply GB/s (one thread), apply / copy (the faster of memcpy and the non-temporal
copy), apply / memcpy, apply / pattern (the apply's own reads and writes, one addition each),
each on one thread; then apply / copy with the pool (threads in brackets).
"""
import json
import statistics
import sys


def figure(row, where, what):
    f = row[where]
    apply = f["apply"]["traffic_gb_per_s"]
    if what == "apply":
        return apply
    if what == "copy":
        return apply / max(f["memcpy"]["traffic_gb_per_s"], f["streaming_copy"]["traffic_gb_per_s"])
    return apply / f[what]["traffic_gb_per_s"]


def cell(values, digits):
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    keys = [(r["optimizer"], r["size"]) for r in runs[0]["cpu"]]
    rows = {k: [] for k in keys}
    for run in runs:
        for r in run["cpu"]:
            rows[(r["optimizer"], r["size"])].append(r)
    print(f"median of {len(runs)} runs (lowest–highest)\n")
    print("| optimizer | size | apply GB/s | apply / copy | apply / memcpy | apply / pattern "
          "| pool: apply / copy |")
    print("|---|---|---|---|---|---|---|")
    for (optimizer, size), rs in rows.items():
        one = [cell([figure(r, "one_thread", w) for r in rs], d)
               for w, d in (("apply", 1), ("copy", 2), ("memcpy", 2), ("pattern", 2))]
        pool = cell([figure(r, "pool", "copy") for r in rs], 2)
        threads = rs[0]["pool"]["threads"]
        print(f"| {optimizer} | {size} | {' | '.join(one)} | {pool} [{threads}] |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
