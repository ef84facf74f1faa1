# SPDX-License-Identifier: Apache-2.0
"""Delta pulls (compression pull: topk, actors/shard/value_deltas.h) through a real server, over
both data paths: what a worker's copy holds after each poll, and what the shard counts."""
import json
import pathlib
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

import psched

WORKER = pathlib.Path(__file__).resolve().parent / "delta_worker.py"
N = 4096  # float64: 32 KiB, over both shards, 1 KiB partitions (128 elements)


def connect(server, worker):
    return psched.connect(server.config, worker)


def status(server, shard):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_ports[shard]}/status") as r:
        return json.load(r)


def deltas(fraction=1 / 128, **more):
    return psched.Compression(pull="topk", pull_fraction=fraction, min_bytes=0, **more)


def step(clients, copies, n, gradients):
    """Step n: each client pushes its gradient and waits for its copy's values. Returns how
    many elements of each copy the step's answers changed: a delta writes at most the poll's
    count per partition, full values may write them all."""
    before = [copy.copy() for copy in copies]
    for client, g in zip(clients, gradients):
        client.push("w", n, g)
    for client in clients:
        client.wait("w", n)
    return [int(np.count_nonzero(copy != old)) for copy, old in zip(copies, before)]


def test_sync_workers_following_deltas_hold_the_same_copy_and_catch_up(start_server):
    server = start_server(mode="sync", workers=2, optimizer="sgd", lr=1.0)
    clients = [connect(server, w) for w in range(2)]
    copies = [np.zeros(N) for _ in range(2)]
    for client, copy in zip(clients, copies):
        client.register("w", copy, compression=deltas())
    truth = np.zeros(N)
    big = np.zeros(N)
    big[::128] = -10.0  # one element a partition changes by 10, the rest by 0.001
    for n in range(1, 4):
        g = np.full(N, -0.001) + big
        changed = N if n == 1 else N // 128  # the values whole, then one element a partition
        assert step(clients, copies, n, [g, g]) == [changed, changed], n
        truth -= g
        # Step 1: no version yet, full values. After: a delta of one element a partition, the
        # one that changed most; every other element lags by what the shard still owes it.
        np.testing.assert_array_equal(copies[0], copies[1])
        owed = truth - copies[0]
        assert np.count_nonzero(owed) == (0 if n == 1 else N - N // 128), n
        np.testing.assert_array_equal(copies[0][::128], truth[::128])
    zero = np.zeros(N)
    for n in range(4, 4 + 128):  # nothing changes: what is owed goes, one element at a time
        # 127 elements a partition owed: one a step until step 130, then a delta of none.
        changed = N // 128 if n <= 130 else 0
        assert step(clients, copies, n, [zero, zero]) == [changed, changed], n
    np.testing.assert_array_equal(copies[0], truth)
    np.testing.assert_array_equal(copies[1], truth)
    counted = [status(server, s)["delta_pulls"] for s in range(2)]
    assert sum(c["full"] for c in counted) == 2 * N // 128  # step 1, each partition each worker
    assert sum(c["published"] for c in counted) == 130 * N // 128  # one a partition a step
    pulled = [status(server, s)["wire_bytes"]["pull"] for s in range(2)]
    assert sum(p["sent"] for p in pulled) < sum(p["raw"] for p in pulled) / 10
    for client in clients:
        client.close()


def test_a_worker_behind_the_ring_or_new_gets_full_values_then_deltas(start_server):
    server = start_server(mode="async", workers=2, optimizer="sgd", lr=1.0)
    with connect(server, 0) as fast, connect(server, 1) as slow:
        a, b = np.zeros(N), np.zeros(N)
        # Deltas of every change (fraction 1): P is V after each, so copies compare with V.
        fast.register("w", a, compression=deltas(fraction=1.0, ring=2))
        slow.register("w", b, compression=deltas(fraction=1.0, ring=2))
        for n in range(1, 6):  # the slow worker polls at step 1 and 6 only
            fast.push("w", n, np.full(N, -1.0))
            fast.wait("w", n)
            if n == 1:
                slow.push("w", 1, np.zeros(N))
                slow.wait("w", 1)
        full_before = sum(status(server, s)["delta_pulls"]["full"] for s in range(2))
        slow.push("w", 2, np.zeros(N))
        slow.wait("w", 2)
        full_after = sum(status(server, s)["delta_pulls"]["full"] for s in range(2))
        assert full_after - full_before == N // 128  # four versions behind a ring of two
        fast.pull("w")  # the shard's values, whole
        np.testing.assert_array_equal(b, a)
        # A restarted worker holds no version: full values first, then deltas.
    with connect(server, 1) as again:
        c = np.full(N, 99.0)
        again.register("w", c, compression=deltas(fraction=1.0, ring=2))
        again.push("w", again.start_step, np.zeros(N))
        again.wait("w", again.start_step)
        np.testing.assert_array_equal(c, a)


def test_refresh_steps_and_a_warm_up_ask_for_full_values(start_server):
    server = start_server(mode="sync", workers=1, optimizer="sgd", lr=1.0)
    with connect(server, 0) as client:
        w = np.zeros(N)
        client.register("w", w, compression=deltas(warmup_steps=2, refresh_steps=4))
        truth = np.zeros(N)
        fulls = []
        for n in range(1, 9):
            client.push("w", n, np.full(N, -1.0))
            client.wait("w", n)
            truth += 1
            fulls.append(sum(status(server, s)["delta_pulls"]["full"] for s in range(2)))
            if n in (2, 4, 8):  # warm-up's full values at 1 (plain polls); 2: no version; 4, 8
                np.testing.assert_array_equal(w, truth)
        per_step = np.diff([0] + fulls) // (N // 128)
        assert list(per_step) == [0, 1, 0, 1, 0, 0, 0, 1]


def test_processes_a_slow_worker_a_killed_worker_and_a_killed_shard_leave_no_copy_adrift(
        start_server, tmp_path):
    """3 worker processes (delta_worker.py), bounded mode: the slow one falls behind the ring
    while the others race ahead (full values); worker 1 is SIGKILLed and restarted (it holds no
    version: full values); the server is SIGKILLed and restarted from its checkpoint while they
    train, and again once all three wait at the end of training (no version of the new
    incarnation: full values, then deltas again; it answers each poll of the drain once). After
    the drain, every worker's copy equals the shard's values."""
    server = start_server(mode="bounded", workers=3, optimizer="sgd", lr=0.05, checkpoint=True,
                          reconnect_seconds=60, extra="staleness: 8\n",
                          compression="{pull: topk, pull_fraction: 0.1, ring: 4, min_bytes: 0}")
    partitions = 2 * 12  # 3000 float32 a shard in 1 KiB partitions
    lines = {}

    def spawn(worker, hold=None, sleep=0.0):
        process = subprocess.Popen(
            [sys.executable, str(WORKER), "--config", str(server.config), "--worker",
             str(worker), "--steps", "40", "--drain", "24", "--out",
             str(tmp_path / f"worker{worker}.npy"), "--sleep", str(sleep),
             "--pause", "40", str(drain)] + (["--hold", str(hold)] if hold else []),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines[worker] = []

        def read(out=lines[worker]):
            for line in process.stdout:
                out.append(line)

        threading.Thread(target=read, daemon=True).start()
        return process

    def reached(worker, step):
        for _ in range(1200):
            if f"worker {worker} step {step}\n" in lines[worker]:
                return
            time.sleep(0.05)
        raise AssertionError(f"worker {worker} did not reach step {step}: {lines[worker]}\n"
                             f"server:\n{''.join(server.log)}")

    def full():
        return sum(status(server, s)["delta_pulls"]["full"] for s in range(2))

    started, go, drain = tmp_path / "started", tmp_path / "go", tmp_path / "drain"
    workers = {0: spawn(0, started), 1: spawn(1, started), 2: spawn(2, go, sleep=0.05)}
    for worker in workers:
        reached(worker, 1)  # each holds after its first step, its first values in hand
    started.touch()
    reached(0, 9)  # the slow worker still holds: the others are 8 steps (16 deltas) ahead
    reached(1, 9)
    go.touch()
    reached(2, 3)
    assert full() > 3 * partitions  # beyond each worker's first poll: the slow one's
    workers[1].kill()
    workers[1].wait()
    workers[1] = spawn(1)
    reached(1, 20)
    assert "worker 1 starts at step 1\n" not in lines[1]  # it rejoined the job where it was
    reached(2, 24)
    server.restart()  # while the others may be up to 8 steps ahead, polls in flight
    for worker in workers:
        reached(worker, 40)  # the end of training: each waits, its values of step 40 in hand
    server.restart()  # nothing in flight: the new incarnation answers the whole drain
    drain.touch()
    for worker, process in workers.items():
        assert process.wait(timeout=100) == 0, "".join(lines[worker])
    counted = [status(server, s)["delta_pulls"] for s in range(2)]
    full, deltas = (sum(c[kind] for c in counted) for kind in ("full", "deltas"))
    # Steps 41 to 64 of three workers, one poll a partition each, each answered once.
    assert full + deltas == 3 * 24 * partitions, (full, deltas)
    # Each worker's first poll of each partition holds a version of the old incarnation: whole.
    # Later ones are deltas, but where a worker is further behind than the ring (4 versions):
    # how often depends on timing (on a 2-core machine 96 full: the slow worker once more, as
    # the others race ahead at the drain's start), so only "most are deltas" is asserted.
    assert 3 * partitions <= full < 3 * 24 * partitions // 2, (full, deltas)
    for worker in workers:
        copy, values = np.load(tmp_path / f"worker{worker}.npy")
        np.testing.assert_array_equal(copy, values)
        assert np.count_nonzero(values) > len(values) // 2


def test_large_partitions_values_arrive_whole_and_a_pull_starts_the_deltas_over(start_server):
    """Partitions of 256 KiB: a worker's first answers are the published copies whole, which the
    shard sends from memory of their own (the copies change with the next delta). A pull
    overwrites the memory with the shard's values: the next poll asks for the values whole."""
    server = start_server(mode="sync", workers=2, optimizer="sgd", lr=1.0)
    n = 1 << 20  # float32: 4 MiB, 8 partitions a shard
    clients = [psched.connect(server.config, w, partition_bytes=256 << 10) for w in range(2)]
    copies = [np.zeros(n, dtype=np.float32) for _ in range(2)]
    for client, copy in zip(clients, copies):
        client.register("w", copy, compression=deltas(fraction=0.5))
    rng = np.random.default_rng(5)
    for s in range(1, 4):
        g = rng.standard_normal(n).astype(np.float32)
        # Step 1: the values whole; then half of each partition, the half that changed most.
        changed = n if s == 1 else n // 2
        assert step(clients, copies, s, [g, g]) == [changed, changed], s
        np.testing.assert_array_equal(copies[0], copies[1])
    partitions = 16

    def full():
        return sum(status(server, s)["delta_pulls"]["full"] for s in range(2))

    assert full() == 2 * partitions  # each worker's first poll
    clients[1].pull("w")
    zero = np.zeros(n, dtype=np.float32)
    # Worker 0's delta carries the half step 3 left owed, all of it (half is the count), so P
    # is the values; worker 1's memory held the values (the pull), and P whole changes nothing.
    assert step(clients, copies, 4, [zero, zero]) == [n // 2, 0]
    assert full() == 3 * partitions  # worker 1's memory held the values: whole again
    np.testing.assert_array_equal(copies[0], copies[1])
    for client in clients:
        client.close()
