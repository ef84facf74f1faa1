#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks what psched-bench and psched-transport-bench write with --json: every figure the
docs describe is there, finite and in range, and the derived ones agree with what they derive
from (ratios, the ideal's rate basis, the CPU split). Exit 1 naming each fault.

    bench/check_bench_json.py FILE.json [FILE.json ...]
"""
import json
import math
import sys

CPU_ROLES = ("psched-client", "psched-shard", "psched-apply", "other")


def positive(faults, where, value):
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        faults.append(f"{where}: {value!r} is not a positive number")


def close(a, b, tolerance=1e-6):
    return abs(a - b) <= tolerance * max(abs(a), abs(b), 1e-12)


def check_switches(where, case, size_bytes, faults):
    """A case's context switches, and the switches per request derived from them."""
    switches = case.get("context_switches")
    if not isinstance(switches, int) or switches < 0:
        faults.append(f"{where}: context_switches {switches!r} is not a count")
        return
    requests = case["bytes_per_iteration"] * case["iterations"] / size_bytes
    if not close(case.get("switches_per_request", -1), switches / requests):
        faults.append(f"{where}: switches_per_request is not context_switches per request")


def check_loop(where, pair, size_bytes, faults):
    """The echo through psched's threads and loops, alone ("loop") and with psched's per-byte
    work ("loop_work"), and the two ratios derived from each."""
    for name in ("loop", "loop_work"):
        loop = pair.get(name)
        if loop is None:
            faults.append(f"{where}: no {name} (the echo through psched's threads and loops)")
            continue
        for key in ("gb_per_s", "cpu_s_per_gb", "iterations", "seconds"):
            positive(faults, f"{where} {name}.{key}", loop.get(key))
        check_switches(f"{where} {name}", loop, size_bytes, faults)
        to_tcp, of_it = pair.get(f"{name}_ratio", 0), pair.get(f"psched_of_{name}", 0)
        if not close(to_tcp, loop["gb_per_s"] / pair["tcp"]["gb_per_s"]):
            faults.append(f"{where}: {name}_ratio {to_tcp} is not {name}/tcp GB/s")
        if not close(of_it, pair["psched"]["gb_per_s"] / loop["gb_per_s"]):
            faults.append(f"{where}: psched_of_{name} {of_it} is not psched/{name} GB/s")


def check_transport(doc, faults):
    buffers = doc.get("echo_buffers")
    if not isinstance(buffers, int) or buffers < 1:
        faults.append(f"echo_buffers {buffers!r} is not a positive count")
    cases = ["sequential", "pipelined"] + (["aggregate"] if doc["workers"] > 1 else [])
    for size in doc["sizes"]:
        for case in cases:
            where = f"{size['size']} {case}"
            pair = size.get(case)
            if pair is None:
                faults.append(f"{where}: missing")
                continue
            for side in ("psched", "tcp"):
                for key in ("gb_per_s", "cpu_s_per_gb", "iterations", "seconds"):
                    positive(faults, f"{where} {side}.{key}", pair[side].get(key))
                check_switches(f"{where} {side}", pair[side], size["size_bytes"], faults)
            if case == "sequential":
                for side in ("psched", "tcp"):
                    positive(faults, f"{where} {side}.p50_us", pair[side].get("p50_us"))
            if not close(pair["ratio"], pair["psched"]["gb_per_s"] / pair["tcp"]["gb_per_s"]):
                faults.append(f"{where}: ratio {pair['ratio']} is not psched/tcp GB/s")
            check_loop(where, pair, size["size_bytes"], faults)


def check_cpu_split(where, split, faults):
    missing = [key for key in CPU_ROLES + ("total",) if key not in split]
    if missing:
        faults.append(f"{where}: cpu_s_per_gb lacks {', '.join(missing)}")
        return
    if any(split[key] < 0 for key in split):
        faults.append(f"{where}: a negative CPU figure in {split}")
    positive(faults, f"{where} cpu_s_per_gb.total", split["total"])
    # "other" is the process's CPU the named threads did not spend: the roles add up to the
    # total unless the named threads' own readings exceed it (then "other" is 0).
    roles = sum(split[key] for key in CPU_ROLES)
    if roles < split["total"] * (1 - 1e-6) or roles > split["total"] * 1.01 + 1e-9:
        faults.append(f"{where}: the roles add up to {roles}, the total is {split['total']}")


def check_scheduling(doc, faults):
    for key in ("ideal_s", "fifo_fluid_s", "ideal_rate_bps", "bandwidth_bps", "compute_s"):
        positive(faults, key, doc.get(key))
    basis = doc.get("ideal_rate_basis")
    tcp = doc.get("tcp_bps")
    if basis not in ("link", "tcp"):
        faults.append(f"ideal_rate_basis: {basis!r} is neither 'link' nor 'tcp'")
    elif basis == "tcp" and (tcp is None or not close(doc["ideal_rate_bps"], tcp)):
        faults.append(f"ideal_rate_bps {doc['ideal_rate_bps']} is not tcp_bps {tcp}")
    if doc.get("shaping") == "tbf":
        positive(faults, "tcp_bps (tbf measures TCP through the links)", tcp)
    if not doc.get("results"):
        faults.append("results: no policy")
    for policy, result in doc.get("results", {}).items():
        positive(faults, f"{policy} iter_s", result.get("iter_s"))
        check_cpu_split(policy, result.get("cpu_s_per_gb", {}), faults)


def main(paths):
    failed = False
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        faults = []
        try:
            (check_transport if doc.get("benchmark") == "transport" else check_scheduling)(
                doc, faults)
        except KeyError as e:
            faults.append(f"missing key {e}")
        for fault in faults:
            print(f"{path}: {fault}", file=sys.stderr)
        failed |= bool(faults)
        if not faults:
            print(f"{path}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
