# SPDX-License-Identifier: Apache-2.0
"""psched.Client's embedding tables against a real psched-server: bad input is refused with an
error naming the table, the id or the setting, and changes nothing; rows travel in bf16 both
ways when asked, and not in the formats that drop part of a gradient."""
import json
import threading
import time
import urllib.request

import numpy as np
import pytest

import psched


def connect(server, worker=0):
    return psched.connect(server.config, worker)


def sgd_table(client, name="t", dim=4, **keywords):
    return client.register_table(name, 10, dim, optimizer="sgd", settings={"lr": 0.5},
                                 init=("uniform", -1.0, 1.0), **keywords)


def rows(client, table, ids, after=None):
    out = np.empty((len(ids), table.dim), np.float32)
    client.pull_rows(table, np.array(ids, np.int64), out, after=after)
    return out


def test_bad_ids_and_widths_name_what_is_wrong_and_apply_nothing(start_server):
    with connect(start_server()) as client:
        table = sgd_table(client)
        before = rows(client, table, range(10))
        client.push_rows(table, np.array([1, 10], np.int64), np.ones((2, 4), np.float32), 1)
        with pytest.raises(psched.Error, match=r"table 't'.*id 10 is not below its 10 rows") as e:
            client.wait_rows(table, 1)
        assert e.value.code == "offset_out_of_range"
        with pytest.raises(psched.Error, match="id -1 is negative"):
            client.push_rows(table, np.array([-1], np.int64), np.ones((1, 4), np.float32), 1)
        with pytest.raises(psched.Error, match="holds no 1 rows of 4") as e:
            client.push_rows(table, np.array([1], np.int64), np.ones((1, 3), np.float32), 1)
        assert e.value.code == "shape_mismatch"
        with pytest.raises(psched.Error, match="rows of float64, the table's are float32"):
            client.push_rows(table, np.array([1], np.int64), np.ones((1, 4)), 1)
        assert np.array_equal(rows(client, table, range(10)), before)  # nothing applied
        client.push_rows(table, np.array([1], np.int64), np.ones((1, 4), np.float32), 1)
        client.wait_rows(table, 1)  # step 1 is still the next one
        assert np.allclose(rows(client, table, [1], after=1), before[1] - 0.5)


def test_a_table_registered_again_differently_or_beyond_a_row_optimizer_is_refused(start_server):
    with connect(start_server()) as client:
        sgd_table(client)
        with pytest.raises(psched.Error, match="table 't'.*different spec") as e:
            sgd_table(client, dim=5)
        assert e.value.code == "spec_conflict"
        with pytest.raises(psched.Error, match="weight_decay"):
            client.register_table("u", 10, 4, optimizer="adagrad", settings={"weight_decay": 0.1})
        with pytest.raises(psched.Error, match="unknown setting 'nesterov'"):
            client.register_table("u", 10, 4, optimizer="sgd", settings={"lr": 1, "nesterov": 1})
        for init in [("uniform", -1.0), ("gaussian", 0.0, 1.0), ("zeros", 0.0, 0.0), ()]:
            with pytest.raises(psched.Error, match="is none of"):
                client.register_table("u", 10, 4, init=init)
        with pytest.raises(psched.Error, match="rows travel as none, bf16 or fp16"):
            sgd_table(client, "u", compression=psched.Compression(push="topk"))


def test_rows_travel_in_bf16_both_ways_when_asked(start_server):
    server = start_server()
    with connect(server) as client:
        table = sgd_table(client, dim=64,
                          compression=psched.Compression(push="bf16", pull="bf16", min_bytes=0))
        exact = sgd_table(client, "exact", dim=64)
        ids = np.arange(10, dtype=np.int64)
        gradient = np.linspace(-1, 1, 640, dtype=np.float32).reshape(10, 64)
        for t in (table, exact):
            client.push_rows(t, ids, gradient, 1)
            client.wait_rows(t, 1)
        narrow, wide = rows(client, table, ids, after=1), rows(client, exact, ids, after=1)
        assert not np.array_equal(narrow, wide)
        assert np.allclose(narrow, wide, rtol=2 ** -8, atol=2 ** -8)  # one bf16 rounding or two
    raw = sent = 0
    for port in server.http_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status") as response:
            wire = json.load(response)["wire_bytes"]
        raw, sent = raw + wire["push"]["raw"], sent + wire["push"]["sent"]
    assert sent == raw * 3 // 4  # the bf16 table's rows at half their bytes, the other's whole


def ready_within(pull, seconds=10.0):
    """Whether `pull` (a psched.RowsPull) finishes within `seconds`."""
    deadline = time.monotonic() + seconds
    while not pull.ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_prefetch_waits_for_the_step_it_names_and_no_other(start_server):
    server = start_server(mode="sync", workers=2, shards=2)
    with connect(server, 0) as zero, connect(server, 1) as one:
        tables = {zero: sgd_table(zero), one: sgd_table(one)}
        ids, gradient = np.arange(10, dtype=np.int64), np.ones((10, 4), np.float32)

        def push(client, step):
            client.push_rows(tables[client], ids, gradient, step)
            client.wait_rows(tables[client], step)

        def prefetch(after):
            out = np.empty((10, 4), np.float32)
            return zero.start_pull_rows(tables[zero], ids, out, after=after, prefetch=True), out

        push(zero, 1)
        push(one, 1)
        after_one = rows(zero, tables[zero], range(10), after=1)
        push(zero, 2)
        # Step 3's rows one step stale: step 1's, at once, though worker 1 holds step 2 back.
        stale, out = prefetch(1)
        assert ready_within(stale)
        stale.wait()
        assert np.array_equal(out, after_one)
        # Step 3's rows fresh wait for step 2; step 4's (held: step 2 is still open) for step 3.
        fresh, fresh_out = prefetch(2)
        ahead, ahead_out = prefetch(3)
        assert not ready_within(fresh, 0.3) and not ahead.ready()
        push(one, 2)
        assert ready_within(fresh)
        fresh.wait()
        assert np.allclose(fresh_out, after_one - 0.5)  # lr 0.5 x the mean gradient, 1
        assert not ready_within(ahead, 0.3)
        push(zero, 3)
        push(one, 3)
        assert ready_within(ahead)
        ahead.wait()
        assert np.allclose(ahead_out, after_one - 1.0)
        with pytest.raises(psched.Error, match="from the future") as e:
            prefetch(6)[0].wait()
        assert e.value.code == "step_from_future"


def test_a_sync_push_ahead_of_an_open_step_waits_for_it_rather_than_being_refused(
        start_server):
    # A worker whose rows came early (a stale prefetch) pushes step 3 while worker 1 still
    # holds step 2 open: its push waits for step 2 to complete on each shard, then applies.
    server = start_server(mode="sync", workers=2, shards=2)
    with connect(server, 0) as zero, connect(server, 1) as one:
        tables = {zero: sgd_table(zero), one: sgd_table(one)}
        ids, gradient = np.arange(10, dtype=np.int64), np.ones((10, 4), np.float32)
        start = rows(zero, tables[zero], range(10))
        for client in (zero, one):
            client.push_rows(tables[client], ids, gradient, 1)
        zero.push_rows(tables[zero], ids, gradient, 2)
        zero.wait_rows(tables[zero], 2)
        zero.push_rows(tables[zero], ids, gradient, 3)
        received = threading.Thread(target=zero.wait_rows, args=(tables[zero], 3))
        received.start()
        received.join(0.3)
        assert received.is_alive()  # held at the worker until step 2 completes
        one.push_rows(tables[one], ids, gradient, 2)
        received.join(10)
        assert not received.is_alive()
        one.push_rows(tables[one], ids, gradient, 3)
        assert np.allclose(rows(one, tables[one], range(10), after=3), start - 1.5)


def http_get(server, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_ports[0]}{path}") as response:
        return response.read().decode()


def test_bounded_tables_evict_and_admit_and_say_so_on_status_and_metrics(start_server):
    server = start_server(shards=1, extra="tables:\n  - {name: t, dim: 4, max_rows: 4}\n"
                                          "limits: {max_table_bytes: 64MiB}\n")
    with connect(server) as client:
        bounded = sgd_table(client)  # max_rows from the deployment's tables: entry
        admitting = sgd_table(client, "u", admit_after=2)
        with pytest.raises(psched.Error, match="dim 5 but the deployment's tables: entry"):
            sgd_table(client, "t", dim=5)
        initial = rows(client, bounded, range(10))
        for step in range(1, 4):
            for table in (bounded, admitting):
                client.push_rows(table, np.arange(3 * step - 3, 3 * step, dtype=np.int64),
                                 np.ones((3, 4), np.float32), step)
                client.wait_rows(table, step)
        # Rows 0-8 pushed once each: the table keeps the last 4 (5-8), the first 5 start again.
        now = rows(client, bounded, range(10), after=3)
        assert np.array_equal(now[:5], initial[:5]) and np.array_equal(now[9], initial[9])
        assert np.allclose(now[5:9], initial[5:9] - 0.5)
        assert np.array_equal(rows(client, admitting, range(10), after=3), initial)  # none twice
    status = json.loads(http_get(server, "/status"))
    tables = {t["name"]: t for t in status["tables"]}
    assert (tables["t"]["rows"], tables["t"]["max_rows"], tables["t"]["rows_evicted"]) == (4, 4, 5)
    assert (tables["u"]["rows"], tables["u"]["updates_dropped"]) == (0, 9)
    held = status["tables_bytes"]
    assert held["limit"] == 64 << 20 and 0 < held["payload"] <= held["held"] < held["limit"]
    metrics = http_get(server, "/metrics")
    assert 'psched_shard_tables_bytes_limit{shard="0"} 67108864' in metrics
    assert 'psched_shard_table_rows_evicted_total{shard="0",table="t"} 5' in metrics


def test_a_push_past_the_shards_table_bytes_is_refused_naming_table_and_limit(start_server):
    server = start_server(shards=1, extra="limits: {max_table_bytes: 1MiB}\n")
    with connect(server) as client:
        table = client.register_table("big", 1_000_000, 16, optimizer="sgd", settings={"lr": 1.0})
        ids = np.arange(50_000, dtype=np.int64)
        client.push_rows(table, ids, np.ones((len(ids), 16), np.float32), 1)
        with pytest.raises(psched.Error, match=r"table 'big'.*limits.max_table_bytes \(1048576\)"
                           ) as refused:
            client.wait_rows(table, 1)
        assert refused.value.code == "overloaded"
        client.push_rows(table, ids[:100], np.ones((100, 16), np.float32), 1)
        client.wait_rows(table, 1)  # step 1 again, small enough: nothing of the first was kept
        status = json.loads(http_get(server, "/status"))
        assert status["tables"][0]["rows"] == 100
        assert status["tables_bytes"]["held"] <= 1 << 20


def test_variables_and_tables_take_their_registration_order_as_priority(start_server):
    with connect(start_server()) as client:
        first = client.register("w", np.zeros(4, np.float32))
        table = sgd_table(client)
        last = client.register("b", np.zeros(4, np.float32))
        assert (first.priority, table.priority, last.priority) == (0, 1, 2)
        assert sgd_table(client, "u", priority=-5).priority == -5


def test_a_pull_still_waiting_when_its_client_closes_fails_rather_than_hangs(start_server):
    server = start_server(mode="sync", workers=2)
    with connect(server, 0) as client:
        table = sgd_table(client)
        out = np.empty((2, 4), np.float32)
        pull = client.start_pull_rows(table, np.array([1, 2], np.int64), out, after=1,
                                      prefetch=True)  # step 1 waits for both workers' pushes
        assert not ready_within(pull, 0.2)
    assert ready_within(pull, 5)
    with pytest.raises(psched.Error, match="closed") as closed:
        pull.wait()
    assert closed.value.code == "disconnected"
