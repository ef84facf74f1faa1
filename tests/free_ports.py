# SPDX-License-Identifier: Apache-2.0
"""Loopback ports for a test's processes, picked by the kernel (bound to port 0, read back),
so that two tests under ctest -j, or two runs of the suite on one machine, do not share one.
Another process could take a port between this call and the server's bind; the server then
fails to start and the test fails saying so, rather than talking to a stranger.

From a shell: `free_ports.py N` prints N free ports; `free_ports.py --at 0,1,1000,1001`
prints a first port P with P+0, P+1, P+1000 and P+1001 all free (for a deployment that counts
its ports up from one, as deploy/slurm/psched.sbatch does)."""
import argparse
import socket


def _bound(port):
    """A socket bound to 127.0.0.1:`port` (0: the kernel's choice), or None where taken."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return s
    except OSError:
        s.close()
        return None


def free_ports(count):
    """`count` distinct ports the kernel just handed out as free on 127.0.0.1."""
    sockets = [_bound(0) for _ in range(count)]
    try:
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port_at(offsets, tries=100):
    """A port P the kernel picked such that P + o is free for every o in `offsets`."""
    for _ in range(tries):
        first = _bound(0)
        base = first.getsockname()[1]
        others = [_bound(base + o) if 0 < base + o < 65536 else None for o in offsets if o]
        for s in [first] + others:
            if s is not None:
                s.close()
        if all(s is not None for s in others):
            return base
    raise RuntimeError(f"no port P with P + {offsets} all free in {tries} tries")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("count", nargs="?", type=int, default=1)
    parser.add_argument("--at", help="offsets from the first port, comma-separated")
    args = parser.parse_args()
    if args.at:
        print(free_port_at([int(o) for o in args.at.split(",")]))
    else:
        print(*free_ports(args.count))
