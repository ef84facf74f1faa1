# SPDX-License-Identifier: Apache-2.0
"""psched-server as a child process of a benchmark script (bench/membership_bench.py,
bench/scaling.py)."""
import os
import subprocess
import sys
import time


def start_server(build, config, work, shards, *options):
    """psched-server on `config` with `options`, its log in WORK/server.log, once all `shards`
    listen; exits the script with the log when it does not start within 30 s."""
    log = os.path.join(work, "server.log")
    server = subprocess.Popen([os.path.join(build, "apps", "psched-server"), "--config", config,
                               *options], stderr=open(log, "w"))
    deadline = time.time() + 30
    while open(log).read().count("listening on") < shards:
        if server.poll() is not None or time.time() > deadline:
            server.kill()
            sys.exit(f"{os.path.basename(sys.argv[0])}: psched-server did not start:\n" +
                     open(log).read())
        time.sleep(0.05)
    return server
