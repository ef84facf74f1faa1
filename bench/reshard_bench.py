#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`psched reshard` on a large table: the rows it moves against the fewest that must move, and
its rate against loopback TCP's and a table's rate of creating rows, measured in the same run.

A table of --rows rows of dim --dim with Adagrad state in float32 is checkpointed by one shard
(build/bench/psched-table-checkpoint-bench) and placed on 2 shards; then, timed, `psched
reshard` places the 2-shard job on 3 and on 4 shards, and the 3-shard job back on 2. For each:
  moved    the rows whose shard changed, against the fewest any placement moves:
           |M - N| / max(M, N) of the rows (a balanced N-shard placement keeps at most
           min(M, N) / max(M, N) of them where they were)
  rate     rows placed a second (every row is read and written: the stopped job's whole
           checkpoint set is rewritten) and the moved rows' bytes a second, beside loopback TCP's
           bytes a second (one stream, 4 MiB sends, this process) and the rate at which a table
           creates rows (build/bench/psched-row-table-bench's first touch)
and its wall and CPU seconds (user + system). This is the stopped job's move (docs/reliability.md,
"Restoring on another number of shards"); shards added to a running job are not built.

  bench/reshard_bench.py [--build build] [--rows 10000000] [--json bench/results/reshard_bench.json]
"""
import argparse
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from results_file import write_json  # the script's folder is on sys.path

PLACED = re.compile(r"placed the job of (\d+) shard\(s\) on (\d+): slot map epoch (\d+), (\d+) of "
                    r"(\d+) slots moved; .* (\d+) row\(s\) \((\d+) moved to another shard")


def loopback_rate(total=2 << 30, piece=4 << 20):
    """Bytes a second through one loopback TCP stream, `total` bytes in sends of `piece`."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def sink():
        connection, _ = server.accept()
        buffer = bytearray(piece)
        while connection.recv_into(buffer):
            pass
        connection.close()

    thread = threading.Thread(target=sink)
    thread.start()
    client = socket.create_connection(server.getsockname())
    data = bytes(piece)
    start = time.monotonic()
    for _ in range(total // piece):
        client.sendall(data)
    client.close()
    thread.join()
    server.close()
    return total / (time.monotonic() - start)


def create_rate(build, dim):
    """Rows a second a table creates (psched-row-table-bench's first touch, 1 M rows)."""
    out = subprocess.run([os.path.join(build, "bench", "psched-row-table-bench"), "--rows",
                          "1000000", "--dim", str(dim), "--optimizer", "adagrad"],
                         check=True, capture_output=True, text=True).stdout
    return float(re.search(r"first touch\s+([\d.]+) M rows/s", out).group(1)) * 1e6


def reshard(psched, source, target, shards):
    """psched reshard, timed: its report's figures, wall and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    out = subprocess.run([psched, "reshard", "--from", source, "--to", target, "--shards",
                          str(shards)], check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = PLACED.search(out)
    n, m, epoch, slots_moved, slots, rows, moved = (int(x) for x in match.groups())
    return {"from": n, "to": m, "epoch": epoch, "slots_moved": slots_moved, "slots": slots,
            "rows": rows, "rows_moved": moved, "seconds": wall,
            "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    psched = os.path.join(args.build, "apps", "psched")
    record = 8 + 2 * 4 * args.dim  # id, value, Adagrad's sums: float32
    work = tempfile.mkdtemp(prefix="reshard-bench-", dir=os.environ.get("TMPDIR", "/tmp"))
    try:
        one = os.path.join(work, "one")
        subprocess.run([os.path.join(args.build, "bench", "psched-table-checkpoint-bench"),
                        "--dir", one, "--rows", str(args.rows), "--dim", str(args.dim)],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([psched, "reshard", "--from", one, "--to", os.path.join(work, "2"),
                        "--shards", "2"], check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(one)
        tcp = loopback_rate()
        create = create_rate(args.build, args.dim)
        print(f"loopback TCP {tcp / 2**20:.0f} MiB/s; a table creates {create / 1e6:.2f} M rows/s",
              flush=True)
        moves = []
        for source, target, shards in (("2", "3", 3), ("2", "4", 4), ("3", "3to2", 2)):
            move = reshard(psched, os.path.join(work, source), os.path.join(work, target), shards)
            n, m = move["from"], move["to"]
            minimum = move["rows"] * abs(m - n) / max(m, n)
            move.update(rows_moved_of_minimum=move["rows_moved"] / minimum,
                        rows_per_s=move["rows"] / move["seconds"],
                        moved_bytes_per_s=move["rows_moved"] * record / move["seconds"])
            move.update(of_loopback=move["moved_bytes_per_s"] / tcp,
                        of_create=move["rows_per_s"] / create)
            moves.append(move)
            print(f"{n} -> {m}: {move['rows_moved']} of {move['rows']} rows moved "
                  f"({move['rows_moved_of_minimum']:.3f}x the fewest), {move['seconds']:.1f} s "
                  f"(CPU {move['cpu_seconds']:.1f} s): {move['rows_per_s'] / 1e6:.2f} M rows/s "
                  f"placed ({move['of_create']:.2f}x a table's creating), moved rows "
                  f"{move['moved_bytes_per_s'] / 2**20:.0f} MiB/s ({move['of_loopback']:.2f} of "
                  "loopback TCP)", flush=True)
        result = {"rows": args.rows, "dim": args.dim, "record_bytes": record,
                  "loopback_bytes_per_s": tcp, "create_rows_per_s": create, "moves": moves,
                  "command": "bench/reshard_bench.py " + " ".join(argv)}
        if args.json:
            write_json(args.json, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
