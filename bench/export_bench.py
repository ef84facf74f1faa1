#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`psched export`'s rate against the disk's, and its peak memory, in the same rounds.

A table of --rows rows of dim --dim with Adagrad state in float32 is checkpointed once
(build/bench/psched-table-checkpoint-bench). Each of --rounds rounds then writes, in turn:
  dd        1 GiB of zeros with conv=fsync (the disk's sequential write rate this round)
  values    psched export --from DIR --to OUT (ids and values: half the checkpoint's bytes)
  state     psched export ... --with-optimizer-state (ids, values and Adagrad's sums)
and, with --baseline PSCHED (another build's psched, say the one before a change), the two
exports again with it, so that a change is judged against the previous build on this machine.
Each export's rate is its bytes written over its wall time, and its ratio to dd's rate of the
same round; its peak RSS is the child's ru_maxrss. The checkpoint is read back from the page
cache (this machine's containers cannot drop it), so the export's reads cost memory copies,
not disk time: what an export right after the job stopped sees.

  bench/export_bench.py [--build build] [--rows 2000000] [--rounds 3] [--baseline PSCHED]
                        [--json bench/results/export_bench.json]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from results_file import write_json  # the script's folder is on sys.path


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(folder) for f in files)


def export_once(psched, state, out, with_state):
    """One export into `out` (removed after): bytes written, seconds, peak RSS (MiB)."""
    # ru_maxrss of RUSAGE_CHILDREN is the largest child's so far: measure in a fresh child.
    code = ("import resource, subprocess, sys, time; s = time.monotonic(); "
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "print(time.monotonic() - s, "
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    command = [psched, "export", "--from", state, "--to", out]
    if with_state:
        command.append("--with-optimizer-state")
    result = subprocess.run([sys.executable, "-c", code, *command], check=True,
                            capture_output=True, text=True)
    seconds, rss = (float(x) for x in result.stdout.split())
    written = folder_bytes(out)
    shutil.rmtree(out)
    return written, seconds, rss


def dd_rate(work):
    """Bytes a second of 1 GiB of zeros written with conv=fsync into `work`."""
    target = os.path.join(work, "dd.bin")
    start = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=1024", "conv=fsync"],
                   check=True, capture_output=True)
    seconds = time.monotonic() - start
    os.remove(target)
    return (1 << 30) / seconds


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="another build's psched to run beside")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    builds = {"this": os.path.join(args.build, "apps", "psched")}
    if args.baseline:
        builds["baseline"] = args.baseline
    work = tempfile.mkdtemp(prefix="export-bench-", dir=os.environ.get("TMPDIR", "/tmp"))
    try:
        state = os.path.join(work, "state")
        subprocess.run([os.path.join(args.build, "bench", "psched-table-checkpoint-bench"),
                        "--dir", state, "--rows", str(args.rows), "--dim", str(args.dim)],
                       check=True, stdout=subprocess.DEVNULL)
        rounds = []
        for index in range(args.rounds):
            row = {"dd_bytes_per_s": dd_rate(work)}
            for name, psched in builds.items():
                for kind, with_state in (("values", False), ("state", True)):
                    written, seconds, rss = export_once(psched, state,
                                                        os.path.join(work, "out"), with_state)
                    row[f"{name}_{kind}"] = {"bytes": written, "seconds": seconds,
                                             "bytes_per_s": written / seconds,
                                             "of_dd": written / seconds / row["dd_bytes_per_s"],
                                             "peak_rss_mib": rss}
            rounds.append(row)
            cells = "  ".join(f"{key} {value['bytes_per_s'] / 2**20:.0f} MiB/s "
                              f"({value['of_dd']:.2f} of dd, {value['peak_rss_mib']:.1f} MiB)"
                              for key, value in row.items() if isinstance(value, dict))
            print(f"round {index + 1}: dd {row['dd_bytes_per_s'] / 2**20:.0f} MiB/s  {cells}",
                  flush=True)
        result = {"rows": args.rows, "dim": args.dim, "rounds": rounds,
                  "command": "bench/export_bench.py " + " ".join(argv)}
        if args.json:
            write_json(args.json, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
