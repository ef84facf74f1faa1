#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Plots psched-bench results: iteration time per policy against bandwidth, one panel per model.

    scripts/plot_bench.py bench/results/*.json -o bench/results/iteration_time.svg
    scripts/plot_bench.py bench/results/*.json --table    # a Markdown table instead

Reads the JSON files `psched-bench --json` writes (any mix of models and bandwidths; files of
one model at one bandwidth are merged), draws each policy's measured iteration time (real
seconds, i.e. divided by the run's time scale), the fluid ideal and the compute-only time on
log-log axes. The format follows the output's extension (.svg, .png, .pdf).
Needs Debian's python3-matplotlib (scripts/setup installs it).
"""
import argparse
import collections
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POLICY_STYLE = {
    "fifo": ("tab:red", "o"),
    "priority": ("tab:blue", "s"),
    "partition-only": ("tab:orange", "^"),
    "priority-only": ("tab:purple", "v"),
    "autotune": ("tab:green", "D"),
    "grid": ("tab:olive", "P"),
}


def policy_rank(policy):
    return list(POLICY_STYLE).index(policy) if policy in POLICY_STYLE else len(POLICY_STYLE)


def load(paths):
    """model -> bandwidth_bps -> {"results": {...}, "ideal_s", "compute_s"}"""
    runs = collections.defaultdict(dict)
    for path in paths:
        with open(path) as f:
            j = json.load(f)
        for key in ("model", "bandwidth_bps", "ideal_s", "compute_s", "results"):
            if key not in j:
                sys.exit(f"{path}: not a psched-bench result (no '{key}')")
        run = runs[j["model"]].setdefault(
            j["bandwidth_bps"], {"results": {}, "ideal_s": j["ideal_s"], "compute_s": j["compute_s"]})
        run["results"].update(j["results"])
    return runs


def plot(runs, output):
    models = sorted(runs)
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        by_rate = runs[model]
        rates = sorted(by_rate)
        gbit = [r / 1e9 for r in rates]
        ax.plot(gbit, [by_rate[r]["ideal_s"] for r in rates], "k--", marker="_", markersize=14, label="ideal (fluid)")
        ax.plot(gbit, [by_rate[r]["compute_s"] for r in rates], "k:", marker="_", markersize=14, label="compute only")
        policies = sorted({p for r in rates for p in by_rate[r]["results"]}, key=policy_rank)
        for policy in policies:
            points = [(r / 1e9, by_rate[r]["results"][policy]["iter_s"])
                      for r in rates if policy in by_rate[r]["results"]]
            color, marker = POLICY_STYLE.get(policy, ("gray", "x"))
            ax.plot(*zip(*points), color=color, marker=marker, label=policy)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bandwidth per worker (Gbit/s)")
        ax.set_ylabel("iteration time (s)")
        ax.set_title(model)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(output)


def table(runs):
    """Markdown: per model and bandwidth, each policy's time, speedup over fifo, share of ideal."""
    lines = ["| model | Gbit/s | policy | iter_s | vs fifo | of ideal | ideal_s | compute_s |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for model in sorted(runs):
        for rate in sorted(runs[model]):
            run = runs[model][rate]
            fifo = run["results"].get("fifo", {}).get("iter_s")
            for policy in sorted(run["results"], key=policy_rank):
                r = run["results"][policy]
                speedup = f"{fifo / r['iter_s']:.2f}x" if fifo else "-"
                lines.append(f"| {model} | {rate / 1e9:.4g} | {policy} | {r['iter_s']:.4f} | "
                             f"{speedup} | {100 * run['ideal_s'] / r['iter_s']:.1f}% | "
                             f"{run['ideal_s']:.4f} | {run['compute_s']:.4f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="psched-bench --json files")
    parser.add_argument("-o", "--output", help="image to write (.svg, .png)")
    parser.add_argument("--table", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    if not args.output and not args.table:
        parser.error("give -o FILE, --table, or both")
    runs = load(args.results)
    if args.table:
        print(table(runs))
    if args.output:
        plot(runs, args.output)
        print(args.output)


if __name__ == "__main__":
    main()
