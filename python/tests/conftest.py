# SPDX-License-Identifier: Apache-2.0
"""Fixtures: psched-server processes on free loopback ports, and a watchdog against hangs.

ctest sets PYTHONPATH (the built package) and PSCHED_SERVER (the server binary); run by hand:
PYTHONPATH=build/python /usr/bin/python3 -m pytest python/tests
"""
import faulthandler
import os
import pathlib
import sys
import subprocess
import threading

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from free_ports import free_ports  # noqa: E402  (test_client.py imports it from here)

SERVER = os.environ.get(
    "PSCHED_SERVER", str(pathlib.Path(__file__).parents[2] / "build/apps/psched-server"))
TEST_SECONDS = 120  # a test still running after this is hung: dump every stack and exit

torch.set_num_threads(1)  # the tests run beside psched's own threads on small CI machines


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(TEST_SECONDS, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()



class Server:
    """A psched-server process hosting every shard of a deployment written to `config`."""

    def __init__(self, config, shards, http_ports, state=None, args=()):
        self.config = config
        self.args = list(args)  # more of psched-server's command line
        self.shards = shards
        self.state = state  # its checkpoint directory, when it has one
        self.http_ports = http_ports  # each shard's operator view (/metrics, /status)
        self.log = []
        self._start()

    def _start(self):
        self.process = subprocess.Popen([SERVER, "--config", str(self.config), "--threads", "2",
                                         "--apply-threads", "1", *self.args],
                                        stderr=subprocess.PIPE, text=True)
        listening = threading.Event()
        threading.Thread(target=self._read_log, args=(self.shards, listening),
                         daemon=True).start()
        listening.wait()
        if self.process.poll() is not None:
            raise RuntimeError("psched-server did not start:\n" + "".join(self.log))

    def restart(self):
        """SIGKILLs the server and starts it again on the same deployment (and checkpoint
        directory, when it has one)."""
        self.kill()
        self.log.append("--- killed and restarted ---\n")
        self._start()

    def _read_log(self, shards, listening):
        # Drains the server's stderr (so it never blocks on a full pipe); sets `listening` when
        # every shard listens or the server ended.
        started = len(self.log)
        for line in self.process.stderr:
            self.log.append(line)
            if sum("listening on" in entry for entry in self.log[started:]) == shards:
                listening.set()
        listening.set()

    def kill(self):
        self.process.kill()
        self.process.wait()

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()


def run_workers(workers, train):
    """train(rank) for each of `workers` (DistributedModels), each in a thread of its own, and
    waits for all; a worker whose train raised has its client closed (a silent thread would hang
    the others in sync mode) and the test fails with what it raised."""
    errors = []

    def run(rank):
        try:
            train(rank)
        except Exception as error:  # reported below
            errors.append(error)
            workers[rank].client.close()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


@pytest.fixture
def start_server(tmp_path):
    """start_server(mode="async", workers=1, shards=2, optimizer="sgd", lr=0.1,
    reconnect_seconds=None, compression=None, checkpoint=False, extra="",
    optimizer_settings=None, args=()) -> Server. optimizer, lr and optimizer_settings (a dict of more
    hyper-parameters) make the deployment's optimizer: section. reconnect_seconds:
    how long its workers keep trying to reconnect (default: the deployment's 60 s).
    compression: the deployment's compression: section, as YAML text. checkpoint: the shards
    keep checkpoints and update logs in a directory of the test's (Server.restart()), or in
    this directory when it is a path (Server.state). extra:
    more of the deployment, as YAML text (a tables: section, limits: ...). args: more of
    psched-server's command line (["--serve", DIR])."""
    servers = []

    def start(mode="async", workers=1, shards=2, optimizer="sgd", lr=0.1, reconnect_seconds=None,
              compression=None, checkpoint=False, extra="", optimizer_settings=None, args=()):
        config = tmp_path / f"deployment{len(servers)}.yaml"
        state = (checkpoint if isinstance(checkpoint, pathlib.Path)
                 else tmp_path / f"state{len(servers)}")
        ports = free_ports(2 * shards)
        settings = "".join(f", {key}: {value}" for key, value in (optimizer_settings or {}).items())
        listen = "".join(f"  - {{listen: 127.0.0.1:{port}, http: 127.0.0.1:{http}}}\n"
                         for port, http in zip(ports[:shards], ports[shards:]))
        config.write_text(f"mode: {mode}\nworkers: {workers}\nshards:\n{listen}"
                          f"optimizer: {{kind: {optimizer}, lr: {lr}{settings}}}\n"
                          "split_bytes: 2KiB\n"  # larger variables span both shards
                          "scheduler: {partition_bytes: 1KiB, credit_bytes: 4KiB}\n" +
                          (f"reconnect: {{timeout_seconds: {reconnect_seconds}}}\n"
                           if reconnect_seconds is not None else "") +
                          (f"compression: {compression}\n" if compression else "") +
                          (f"checkpoint: {{directory: {state}, interval_seconds: 0.2}}\n"
                           if checkpoint else "") + extra +
                          # ctest runs the suite over both data paths
                          (f"data_path: {os.environ['PSCHED_TEST_DATA_PATH']}\n"
                           if "PSCHED_TEST_DATA_PATH" in os.environ else ""))
        servers.append(Server(config, shards, ports[shards:], state if checkpoint else None,
                              args))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
