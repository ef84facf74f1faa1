# SPDX-License-Identifier: Apache-2.0
"""Loopback ports for a test's processes, picked by the kernel (bound to port 0, read back),
so that two tests under ctest -j, or two runs of the suite on one machine, do not share one.
Another process could take a port between this call and the server's bind; the server then
fails to start and the test fails saying so, rather than talking to a stranger."""
import socket


def free_ports(count):
    """`count` distinct ports the kernel just handed out as free on 127.0.0.1."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
